"""Seeded random faults for the fault proxy (s3_fault_proxy.py): each
request meets at most one fault, drawn with a probability per kind.

A draw depends on the request, not on the order requests arrive in: it is
seeded by the run's seed, the request's identity (method, key, query
parameter names, part number and listing prefix, Range; generation ids
masked, the bucket left out) and how many times that identity came
before, so that a retry draws anew. A replay with the same seed therefore
makes the same decisions for the same requests however the client's
threads interleave; which requests a run makes can still vary with
timing (a timeout cutting retries short, which writer thread stores which
chunk).
"""

from __future__ import annotations

import collections
import hashlib
import random
import re
import threading
import urllib.parse

from s3_fault_proxy import Fault

# Fault kinds a plan draws from, and the requests each applies to.
KINDS = ("slowdown", "internal", "drop", "cut", "lost", "flip_get", "flip_put", "delay",
         "stall")
# The faults a retrying client rides through, at rates where 4 requests in
# 10 meet one, and a few stalls that outlast the operations' timeout_s:
# most operations succeed after retries, some run out of time and raise.
TRANSIENT = {"slowdown": 0.08, "internal": 0.06, "drop": 0.06, "cut": 0.06, "lost": 0.06,
             "delay": 0.1, "stall": 0.01}
# And bits flipped in stored and read bytes, which only checksums catch.
ALL_KINDS = {**TRANSIENT, "flip_get": 0.03, "flip_put": 0.03}

_GENERATION = re.compile(r"\.shardkeep-g[0-9a-f]{16}")


def _is_object(path: str) -> bool:
    """/bucket/key, not /bucket (listings, multipart listings)."""
    return len(path.strip("/").split("/", 1)) == 2


def _applies(kind: str, method: str, path: str, has_body: bool) -> bool:
    if kind == "flip_get":  # stored bytes read back wrong, not listings or errors
        return method == "GET" and _is_object(path)
    if kind == "flip_put":  # object and part uploads, not the XML of other requests
        return method == "PUT" and has_body
    return True


class RandomFaults:
    """A seeded plan: ``rates`` maps kinds of KINDS to the probability that
    a request they apply to meets them (the rates a request can meet sum to
    at most 1). Delays are drawn uniformly up to ``max_delay_s``; a stall
    holds the answer ``stall_s``, to be longer than the operations'
    timeout_s (the CLI, which takes no timeout, waits it out). With
    ``paths`` (a regular expression), only requests whose path it matches
    meet faults."""

    def __init__(self, seed: int, rates: dict[str, float], max_delay_s: float = 1.0,
                 stall_s: float = 8.0, paths: str | None = None):
        unknown = set(rates) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {KINDS}")
        if sum(rates.values()) > 1:
            raise ValueError(f"the rates {rates} sum to more than 1")
        self.seed = seed
        self.rates = dict(rates)
        self.max_delay_s = max_delay_s
        self.stall_s = stall_s
        self.paths = re.compile(paths) if paths is not None else None
        self._lock = threading.Lock()
        self._occurrences: collections.Counter[str] = collections.Counter()

    def choose(self, method: str, target: str, headers: dict[str, str]) -> Fault | None:
        path, _, query = target.partition("?")
        if self.paths is not None and not self.paths.search(path):
            return None
        params = urllib.parse.parse_qs(query, keep_blank_values=True)
        key = path.lstrip("/").partition("/")[2]  # not the bucket: tests name theirs at random
        identity = _GENERATION.sub(".shardkeep-g*", " ".join([
            method, key, ",".join(sorted(params)), *params.get("partNumber", []),
            *params.get("prefix", []), headers.get("range", "")]))
        with self._lock:
            occurrence = self._occurrences[identity]
            self._occurrences[identity] += 1
        digest = hashlib.blake2b(f"{self.seed}\0{identity}\0{occurrence}".encode(),
                                 digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        draw, at, delay = rng.random(), rng.random(), rng.uniform(0, self.max_delay_s)
        has_body = int(headers.get("content-length", "0") or 0) > 0
        for kind in KINDS:
            if not _applies(kind, method, path, has_body):
                continue
            draw -= self.rates.get(kind, 0.0)
            if draw < 0:
                return self._fault(kind, at, delay)
        return None

    def _fault(self, kind: str, at: float, delay_s: float) -> Fault:
        if kind == "slowdown":
            return Fault("error", status=503, code="SlowDown")
        if kind == "internal":
            return Fault("error", status=500, code="InternalError")
        if kind.startswith("flip"):
            return Fault("flip", at=at)
        if kind == "stall":
            return Fault("delay", delay_s=self.stall_s)
        return Fault(kind, at=at, delay_s=delay_s)
