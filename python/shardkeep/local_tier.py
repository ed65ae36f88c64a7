"""The local tier: frequent saves to each process's own storage, with a peer copy.

docs/MANAGER.md ("Local tier") has the user-facing rules; this is how it works.

Layout. A process's local root holds folders ``p<q>``; ``p<q>/<step>`` is a
committed one-process checkpoint holding *slice* q of that step: the boxes
process q writes in a save of the whole job (the replica-parallel plan, so
the slices of all processes are disjoint and together tile every leaf).
Process p keeps its own slice in ``p<p>`` and a copy of its ring
predecessor's in ``p<(p-1) % P>``, so losing one process's root loses no
slice.

A slice is not stored as a partial checkpoint of the job's tree: the core
refuses a one-process save whose shards do not cover every element (a
one-process checkpoint must load by itself). Instead each pytree
checkpointable of the slice holds one leaf per stored box (leaf k is the
k-th box, whole), and the json checkpointable ``shardkeep-local-slice``
records, per original checkpointable, its meta.json and which box of which
leaf each slice leaf is. json and bytes checkpointables are kept whole in
every slice. Every slice is therefore a complete, checksummed checkpoint of
its own, and the commit record's custom_metadata says
``{"shardkeep_local": {"process": q, "process_count": P}}``.

Save (blocking phase, training thread): stage this process's boxes as a
save of the job does, send them to the successor with ``exchange_bytes``
(collective: every process saves the same steps) and receive the
predecessor's, then start both one-process saves in the background.

Restore (collective): each process lists its root and publishes which
slices of which steps it holds; every process then picks the same step:
the newest one whose every slice is held by some process. Loading plans
the target's boxes with ``restore.restore_pytree`` itself (the boxes a
load reads), cuts each into the stored boxes it overlaps, reads the pieces
of slices held here from local storage and asks the holders of the others
for theirs (two ``exchange_bytes``), then builds the values from those
pieces. Casts happen where the piece is read, by the core.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import re
import threading
import time
from typing import Any, Mapping

import jax
import numpy as np

from . import _core, checkpointables, distributed, dtypes, exchange, restore
from . import options as options_lib
from . import save as save_lib
from .errors import IncompatibleError, InvalidArgumentError, NotFoundError, ShardkeepError

logger = logging.getLogger("shardkeep")

SLICE_PART = "shardkeep-local-slice"
_FOLDER = re.compile(r"p([0-9]+)")
_STEP_NAME = re.compile(r"[0-9]+")


@dataclasses.dataclass
class LocalSave:
    """One started save of a slice, waiting in the manager's worker for its commit."""

    step: int
    folder: int          # the slice's process q: the save goes to p<q>
    name: str
    future: save_lib.SaveFuture
    started: float
    observed: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class Decision:
    """The step the local tiers can rebuild, and who holds each of its slices."""

    step: int
    process_count: int                 # P_S: processes that saved the step
    holders: dict[int, list[int]]      # slice q -> processes holding it
    paths: dict[int, str]              # slice q -> its checkpoint, for slices held here


def local_root(template, process_index: int) -> str:
    """``template`` with ``{process}`` replaced: this process's local root."""
    root = os.fspath(template)
    if root.startswith("file://"):
        root = root[len("file://"):]
    if re.match(r"[A-Za-z][A-Za-z0-9+.\-]*://", root):
        raise InvalidArgumentError(
            f"local_root must be a path on this host's own storage, got {root!r}")
    return os.path.abspath(root.replace("{process}", str(process_index)))


class LocalTier:
    """The local tier of one manager (see the module docstring)."""

    def __init__(self, template, *, interval: int, keep_last: int,
                 options: options_lib.Options, width: int, number: int):
        self.me = jax.process_index()
        self.count = jax.process_count()
        self.root = local_root(template, self.me)
        self.interval = interval
        self.keep_last = keep_last
        self._options = options
        self._width = width
        self._number = number
        self._restores = itertools.count()
        self._last_started: int | None = None
        os.makedirs(self.root, exist_ok=True)
        # folder q -> {step: name} of committed slices; only this process
        # writes and deletes in its root, so the record stays true.
        self.held: dict[int, dict[int, str]] = {}
        for q, listing in self._list().items():
            self.held[q] = {step: name for step, (name, _) in listing.items()}

    # -- saving ----------------------------------------------------------

    def due(self, step: int) -> bool:
        return step % self.interval == 0 and (self._last_started is None
                                              or step > self._last_started)

    def save(self, step: int, items: Mapping[str, Any]) -> list[LocalSave]:
        """The blocking phase of a local save of ``step``; returns the started saves."""
        if SLICE_PART in items:
            raise InvalidArgumentError(
                f"checkpointable name {SLICE_PART!r} is reserved by the local tier")
        self._last_started = step
        started = time.monotonic()
        parts, lease = save_lib.stage_parts(items, self._options, own_copies=True)
        try:
            header, buffers = _describe_slice(parts)
        except BaseException:
            lease.give_back()
            raise
        saves = []
        if self.count > 1:
            pred, succ = (self.me - 1) % self.count, (self.me + 1) % self.count
            message = [_json_bytes({**header, "process": self.me, "step": step}), *buffers]
            try:
                received = exchange.exchange_bytes({succ: message},
                                                   timeout_s=self._options.timeout_s)
            except BaseException:
                lease.give_back()
                raise
            if pred not in received:
                lease.give_back()
                raise ShardkeepError(
                    f"local save of step {step}: process {pred} sent no copy of its slice")
            peer_header = json.loads(received[pred][0].tobytes())
            if peer_header.get("step") != step or peer_header.get("process") != pred:
                lease.give_back()
                raise ShardkeepError(
                    f"local save of step {step}: process {pred} sent step"
                    f" {peer_header.get('step')} of process {peer_header.get('process')}")
            saves.append(self._start(step, self.me, header, buffers, lease))
            saves.append(self._start(step, pred, peer_header, received[pred][1:], None))
        else:
            saves.append(self._start(step, self.me, header, buffers, lease))
        logger.info("step %d: local save started (%s), blocking phase %.3f s", step,
                    self.root, time.monotonic() - started)
        return saves

    def _start(self, step: int, q: int, header: dict, buffers: list, lease) -> LocalSave:
        name = f"{step:0{self._width}d}"
        folder = os.path.join(self.root, f"p{q}")
        os.makedirs(folder, exist_ok=True)
        parts = _slice_parts(header, buffers, q, self.count)
        future = save_lib.start_single_process_async(
            os.path.join(folder, name), parts, options=self._options, step=step,
            custom_metadata={"shardkeep_local": {"process": q, "process_count": self.count}},
            force=True, lease=lease)
        return LocalSave(step, q, name, future, time.monotonic())

    def committed(self, job: LocalSave) -> list[str]:
        """Records a committed slice; returns the paths retention drops.

        Retention keeps the newest ``keep_last`` steps of each folder this
        job writes. Folders it does not write (slices of a job with another
        process count) lose every step older than those kept.
        """
        steps = self.held.setdefault(job.folder, {})
        steps[job.step] = job.name
        dropped = [(job.folder, s) for s in sorted(steps)[:-self.keep_last]]
        oldest_kept = sorted(steps)[-self.keep_last:][0]
        written = {self.me, (self.me - 1) % self.count}
        for q, other in self.held.items():
            if q not in written:
                dropped += [(q, s) for s in other if s < oldest_kept]
        paths = []
        for q, s in dropped:
            paths.append(os.path.join(self.root, f"p{q}", self.held[q].pop(s)))
        return paths

    def forget(self, q: int, step: int) -> None:
        self.held.get(q, {}).pop(step, None)

    # -- restoring -------------------------------------------------------

    def decide(self) -> Decision | None:
        """The newest step every slice of which some process holds (collective)."""
        listing = self._list()
        mine = {}
        for q, steps in listing.items():
            for step, (_, count) in steps.items():
                mine.setdefault(step, {})[q] = count
        if self.count > 1:
            bridge = distributed.coordination()
            key = f"shardkeep/local/{self._number}/restore-{next(self._restores)}/held"
            bridge.set(f"{key}/{self.me}", json.dumps(
                {str(s): {str(q): c for q, c in v.items()} for s, v in mine.items()}))
            everyone = {}
            for p in range(self.count):
                text = bridge.get(f"{key}/{p}", self._options.timeout_s)
                everyone[p] = {int(s): {int(q): c for q, c in v.items()}
                               for s, v in json.loads(text).items()}
        else:
            everyone = {0: mine}
        steps = sorted({s for held in everyone.values() for s in held}, reverse=True)
        for step in steps:
            counts = {c for held in everyone.values() for c in held.get(step, {}).values()}
            if len(counts) != 1:
                if len(counts) > 1:
                    logger.warning("local step %d is ignored: its slices disagree on the"
                                   " process count (%s)", step, sorted(counts))
                continue
            (count,) = counts
            holders = {q: sorted(p for p, held in everyone.items() if q in held.get(step, {}))
                       for q in range(count)}
            if all(holders.values()):
                paths = {q: os.path.join(self.root, f"p{q}", listing[q][step][0])
                         for q in range(count) if self.me in holders[q]}
                return Decision(step, count, holders, paths)
        return None

    def _list(self) -> dict[int, dict[int, tuple[str, int]]]:
        """folder q -> {step: (name, process count)} of committed slices;
        leftovers of unfinished saves are removed."""
        found: dict[int, dict[int, tuple[str, int]]] = {}
        core_options = self._options.to_core()
        for entry in sorted(os.listdir(self.root)):
            match = _FOLDER.fullmatch(entry)
            folder = os.path.join(self.root, entry)
            if match is None or not os.path.isdir(folder):
                continue
            q = int(match.group(1))
            steps = found.setdefault(q, {})
            entries = _core.list_checkpoints(folder, core_options)
            committed = {name for name, state, *_ in entries if state == "committed"}
            for name, state, _, commit_json, problem in entries:
                path = os.path.join(folder, name)
                if state in ("temporary", "being-deleted", "unfinished") or (
                        state == "replaced" and name.rsplit(".", 1)[0] in committed):
                    _remove_quietly(path, core_options)
                    continue
                if state != "committed" or not _STEP_NAME.fullmatch(name):
                    if state == "rejected":
                        logger.warning("%s is ignored: %s", path, problem)
                    continue
                mark = (json.loads(commit_json).get("custom_metadata") or {}).get(
                    "shardkeep_local") or {}
                count = mark.get("process_count")
                if mark.get("process") != q or not isinstance(count, int) or count <= q:
                    logger.warning("%s is ignored: it is not slice %d of a local save", path, q)
                    continue
                steps.setdefault(int(name), (name, count))
        return found

    def load(self, decision: Decision, targets: Mapping[str, Any] | None, *, partial: bool,
             options: options_lib.Options) -> dict[str, Any]:
        """Loads step ``decision.step`` from the slices (collective)."""
        started = time.monotonic()
        core_options = options.to_core()
        slices, values = self._gather_descriptions(decision, core_options)
        first = slices[0]
        parts = {p["name"]: p for p in first["parts"]}
        if targets is None:
            targets = {name: None for name in parts}
        if not isinstance(targets, Mapping):
            raise InvalidArgumentError(
                f"targets must map checkpointable names to targets, got {type(targets).__name__}")
        where = f"local step {decision.step} under {self.root}"
        for name in targets:
            if name not in parts:
                raise NotFoundError(f"{where} has no checkpointable {name!r}; it has"
                                    f" {sorted(parts)}")
        # Which stored box of which slice holds each part of each leaf.
        stored: dict[str, dict[int, list[tuple]]] = {}
        for q, description in slices.items():
            for part in description["parts"]:
                by_leaf = stored.setdefault(part["name"], {})
                for k, (leaf, _, origin, shape) in enumerate(part.get("shards", [])):
                    by_leaf.setdefault(leaf, []).append((q, k, tuple(origin), tuple(shape)))
        metas = {name: json.loads(parts[name]["meta"]) for name in targets}
        requests = {name: _planned_requests(where, name, metas[name], target, partial,
                                            core_options)
                    for name, target in targets.items() if parts[name]["kind"] == "pytree"}
        pieces = _cut(where, requests, stored)
        fetched = self._fetch(decision, pieces, core_options)
        results = {}
        for name, target in targets.items():
            kind = parts[name]["kind"]
            if kind == "pytree":
                reader = _PieceReader(where, pieces[name], fetched)
                value = restore.restore_pytree(reader, f"{where}/{name}", name, metas[name],
                                               target, partial=partial,
                                               core_options=core_options, map_files=False)
            elif target is not None:
                raise InvalidArgumentError(f"{where}/{name} is of kind {kind!r}, which takes"
                                           " no target")
            elif kind == "json":
                value = json.loads(values[name])
            else:
                value = values[name]
            results[name] = checkpointables.decode(metas[name], value)
        logger.info("restored local step %d in %.3f s", decision.step,
                    time.monotonic() - started)
        return results

    def _gather_descriptions(self, decision: Decision, core_options
                             ) -> tuple[dict[int, dict], dict[str, bytes]]:
        """Every slice's description, and the json/bytes values (collective:
        each slice's lowest holder sends its description to the others)."""
        slices: dict[int, dict] = {}
        values: dict[str, bytes] = {}
        readers = {q: _core.Reader(path, core_options) for q, path in decision.paths.items()}
        for q, reader in readers.items():
            slices[q] = json.loads(reader.read_value(SLICE_PART))
        if readers:
            q, reader = next(iter(readers.items()))
            values = {p["name"]: reader.read_value(p["name"]) for p in slices[q]["parts"]
                      if p["kind"] != "pytree"}
        if self.count > 1:
            outgoing: dict[int, list[np.ndarray]] = {}
            for q, holders in decision.holders.items():
                if holders[0] != self.me:
                    continue
                description = _json_bytes(slices[q])
                for p in range(self.count):
                    if p not in holders:
                        outgoing.setdefault(p, []).append(description)
            value_sender = min(h[0] for h in decision.holders.values())
            if value_sender == self.me:
                for p in range(self.count):
                    if not any(p in h for h in decision.holders.values()):
                        outgoing.setdefault(p, []).extend(
                            [_json_bytes(sorted(values)),
                             *[np.frombuffer(values[n], np.uint8) for n in sorted(values)]])
            received = exchange.exchange_bytes(outgoing, timeout_s=self._options.timeout_s)
            for sender, buffers in received.items():
                i = 0
                while i < len(buffers):
                    document = json.loads(buffers[i].tobytes())
                    i += 1
                    if isinstance(document, list):  # the names of the values that follow
                        for name in document:
                            values[name] = buffers[i].tobytes()
                            i += 1
                    else:
                        slices[document["process"]] = document
        missing = [q for q in range(decision.process_count) if q not in slices]
        if missing:
            raise ShardkeepError(f"local step {decision.step}: no description of slices"
                                 f" {missing} arrived")
        return slices, values

    def _fetch(self, decision: Decision, pieces: dict[str, dict[tuple, list]],
               core_options) -> dict[tuple, np.ndarray]:
        """The bytes of every piece: read here, or from its slice's holder
        (collective: requests go out in one exchange, bytes come back in
        another)."""
        wanted: dict[int, list[tuple]] = {}
        for name, by_request in pieces.items():
            for request, request_pieces in by_request.items():
                dtype_name = request[1]
                for q, k, sub_origin, sub_shape, _ in request_pieces:
                    key = (name, q, k, sub_origin, sub_shape, dtype_name)
                    holder = (self.me if self.me in decision.holders[q]
                              else decision.holders[q][0])
                    wanted.setdefault(holder, []).append(key)
        for holder in wanted:
            wanted[holder] = sorted(set(wanted[holder]))
        fetched = self._read_pieces(decision, wanted.pop(self.me, []), core_options)
        if self.count == 1:
            return fetched
        asked = exchange.exchange_bytes(
            {h: [_json_bytes(keys)] for h, keys in wanted.items()},
            timeout_s=self._options.timeout_s)
        replies = {}
        for asker, (request,) in asked.items():
            keys = [(n, q, k, tuple(o), tuple(s), d) for n, q, k, o, s, d in
                    json.loads(request.tobytes())]
            served = self._read_pieces(decision, keys, core_options)
            replies[asker] = [dtypes.as_bytes(served[key]) for key in keys]
        answers = exchange.exchange_bytes(replies, timeout_s=self._options.timeout_s)
        for holder, keys in wanted.items():
            got = answers.get(holder, [])
            if len(got) != len(keys):
                raise ShardkeepError(f"local step {decision.step}: process {holder} sent"
                                     f" {len(got)} of the {len(keys)} pieces asked")
            for key, data in zip(keys, got):
                dtype = dtypes.from_name(key[5])
                fetched[key] = data.view(dtype).reshape(key[4])
        return fetched

    def _read_pieces(self, decision: Decision, keys: list[tuple],
                     core_options) -> dict[tuple, np.ndarray]:
        """Reads pieces of slices held here: one read call per slice and part."""
        out: dict[tuple, np.ndarray] = {}
        groups: dict[tuple, list[tuple]] = {}
        for key in keys:
            groups.setdefault((key[1], key[0]), []).append(key)
        for (q, name), group in groups.items():
            if q not in decision.paths:
                raise ShardkeepError(f"local step {decision.step}: slice {q} was asked of"
                                     f" process {self.me}, which does not hold it")
            reader = _core.Reader(decision.paths[q], core_options)
            requests = []
            for key in group:
                buffer = np.empty(key[4], dtypes.from_name(key[5]))
                out[key] = buffer
                requests.append((key[2], key[5], list(key[3]), list(key[4]),
                                 dtypes.as_bytes(buffer)))
            reader.read(name, requests, core_options)
        return out


class _Planned(Exception):
    """Stops a planning pass of restore_pytree at its read, with its requests."""

    def __init__(self, requests):
        super().__init__("planned")
        self.requests = requests


class _PlanningReader:
    def read(self, name, requests, options=None):
        raise _Planned([(r[0], r[1], tuple(r[2]), tuple(r[3])) for r in requests])


def _planned_requests(where: str, name: str, meta: dict, target: Any, partial: bool,
                      core_options) -> list[tuple]:
    """The (leaf, dtype name, origin, shape) boxes a load of ``target`` reads
    on this process: restore_pytree's own plan, stopped at its read."""
    try:
        restore.restore_pytree(_PlanningReader(), f"{where}/{name}", name, meta, target,
                               partial=partial, core_options=core_options, map_files=False)
    except _Planned as planned:
        return planned.requests
    return []


def _cut(where: str, requests: dict[str, list[tuple]],
         stored: dict[str, dict[int, list[tuple]]]) -> dict[str, dict[tuple, list]]:
    """Each request cut into the stored boxes it overlaps:
    part -> request -> [(slice q, slice leaf k, origin in the stored box,
    shape, origin in the request)]."""
    out: dict[str, dict[tuple, list]] = {}
    for name, part_requests in requests.items():
        by_request = out.setdefault(name, {})
        for request in part_requests:
            leaf, _, origin, shape = request
            pieces, covered = [], 0
            for q, k, box_origin, box_shape in stored.get(name, {}).get(leaf, []):
                lo = [max(a, b) for a, b in zip(origin, box_origin)]
                hi = [min(a + n, b + m) for a, n, b, m in
                      zip(origin, shape, box_origin, box_shape)]
                if any(h <= l for l, h in zip(lo, hi)):
                    continue  # disjoint (a 0-d leaf's one box always overlaps)
                sub_shape = tuple(h - l for l, h in zip(lo, hi))
                pieces.append((q, k, tuple(l - b for l, b in zip(lo, box_origin)), sub_shape,
                               tuple(l - o for l, o in zip(lo, origin))))
                covered += math.prod(sub_shape)
            if covered != math.prod(shape):
                raise IncompatibleError(
                    f"{where}/{name}: the slices cover {covered} of the {math.prod(shape)}"
                    f" elements of box {list(origin)}+{list(shape)} of leaf {leaf}")
            by_request[request] = pieces
    return out


class _PieceReader:
    """Serves restore_pytree's read from the pieces fetched for it."""

    def __init__(self, where: str, pieces: dict[tuple, list], fetched: dict[tuple, np.ndarray]):
        self._where = where
        self._pieces = pieces
        self._fetched = fetched

    def read(self, name, requests, options=None):
        for leaf, dtype_name, origin, shape, dst in requests:
            request = (leaf, dtype_name, tuple(origin), tuple(shape))
            if request not in self._pieces:
                raise ShardkeepError(f"{self._where}/{name}: box {list(origin)}+{list(shape)}"
                                     f" of leaf {leaf} was not planned")
            box = dst.view(dtypes.from_name(dtype_name)).reshape(shape)
            for q, k, sub_origin, sub_shape, at in self._pieces[request]:
                data = self._fetched[(name, q, k, sub_origin, sub_shape, dtype_name)]
                box[tuple(slice(a, a + n) for a, n in zip(at, sub_shape))] = data


def _describe_slice(parts: list[dict]) -> tuple[dict, list[np.ndarray]]:
    """A staged save's parts as a JSON header and flat byte buffers."""
    header_parts, buffers = [], []
    for part in parts:
        entry = {"name": part["name"], "kind": part["kind"], "meta": part["meta_json"]}
        if part["kind"] == "pytree":
            entry["shards"] = []
            for leaf, dtype_name, origin, shape, data in part["shards"]:
                if callable(data):  # an ArraySource's box, produced on demand
                    data = _materialise(data, origin, shape)
                entry["shards"].append([leaf, dtype_name, list(origin), list(shape)])
                buffers.append(np.asarray(data, np.uint8).reshape(-1))
        else:
            buffers.append(np.frombuffer(bytes(part["value"]), np.uint8))
        header_parts.append(entry)
    return {"parts": header_parts}, buffers


def _materialise(fill, origin, shape) -> np.ndarray:
    data = fill(list(origin), list(shape))
    return np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data


def _slice_parts(header: dict, buffers: list, q: int, count: int) -> list[dict]:
    """The parts of slice ``q``'s one-process checkpoint (see the module docstring)."""
    parts, i = [], 0
    description = {"process": q, "process_count": count, "parts": []}
    for entry in header["parts"]:
        description["parts"].append(entry)
        if entry["kind"] != "pytree":
            parts.append({"name": entry["name"], "kind": entry["kind"],
                          "value": buffers[i].tobytes(), "meta_json": entry["meta"],
                          "shards": []})
            i += 1
            continue
        leaves, shards = [], []
        for k, (_, dtype_name, _, shape) in enumerate(entry["shards"]):
            leaves.append({"path": str(k), "kind": "array", "dtype": dtype_name,
                           "shape": list(shape), "sharding": None})
            shards.append((k, dtype_name, [0] * len(shape), list(shape), buffers[i]))
            i += 1
        meta = {"kind": "pytree",
                "tree": {"type": "list",
                         "children": [{"type": "leaf", "leaf": k} for k in range(len(leaves))]},
                "leaves": leaves}
        parts.append({"name": entry["name"], "kind": "pytree", "value": b"",
                      "meta_json": _core.encode_meta(meta), "shards": shards})
    parts.append({"name": SLICE_PART, "kind": "json",
                  "value": json.dumps(description).encode(),
                  "meta_json": _core.encode_meta({"kind": "json"}), "shards": []})
    return parts


def _json_bytes(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


def _remove_quietly(path: str, core_options) -> None:
    try:
        _core.remove_leftover(path, core_options)
    except ShardkeepError as e:
        logger.warning("could not remove %s: %s", path, e)


