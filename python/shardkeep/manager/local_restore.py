"""Loading a local step from the slices the job's processes hold.

Collective: every process of the job calls ``load`` with the same decision
(``LocalTier.decide``) and targets.

1. Descriptions: each slice's server (``Decision.server``) sends its
   ``shardkeep-local-slice`` record to the processes that lack the slice;
   the lowest holder of any slice sends the json and bytes values to the
   processes that hold none.
2. Plan: ``load_plan.plan`` plans the load (the boxes this process
   needs, per leaf, in the target's dtype); each box is cut into the
   stored boxes it overlaps.
3. Fetch: pieces of slices held here are read from the local slice
   checkpoints (the core checks their checksums and casts); the others are
   asked of the slice's server, which reads them the same way and
   sends the bytes back. Only the bytes the target needs travel.
4. Build: the load executor runs the same plan against a source that
   copies the pieces into its buffers (``_PiecesSource``), so values,
   shardings, casts, PRNG keys and partial loads are exactly those of
   ``shardkeep.load``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Mapping, NamedTuple

import numpy as np

from .. import _core
from ..base import checkpointables, dtypes, events
from ..job import exchange
from ..loading import load_executor, load_plan, load_source
from ..base import named_parts
from . import local_slices
from .local_slices import Decision
from .. import options as options_lib
from ..errors import (CorruptionError, IncompatibleError, InvalidArgumentError, NotFoundError,
                      ShardkeepError)

logger = logging.getLogger("shardkeep")


class Box(NamedTuple):
    """A box of a leaf that the load plan reads, in the dtype it reads."""

    leaf: int
    dtype: str
    origin: tuple[int, ...]
    shape: tuple[int, ...]


class Stored(NamedTuple):
    """A box stored in a slice: leaf ``leaf`` of the slice's checkpoint."""

    slice: int
    leaf: int
    origin: tuple[int, ...]
    shape: tuple[int, ...]


class Piece(NamedTuple):
    """The part of a planned box that one stored box holds: where it is in
    the stored box (``origin``), its ``shape``, and where it goes in the
    planned box (``at``)."""

    slice: int
    leaf: int
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    at: tuple[int, ...]


class PieceKey(NamedTuple):
    """A piece of a slice to fetch, as processes ask each other for it (a
    JSON list on the wire)."""

    part: str
    slice: int
    leaf: int
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str


def restore(tier, persistent: int | None, target: Any, *, partial: bool,
            options: options_lib.Options) -> tuple[int, Any] | None:
    """(step, value) of the newest local step the job can rebuild, loaded
    onto ``target`` as ``CheckpointManager.restore`` loads; None when there
    is none or it is older than ``persistent`` (the latest persistent step,
    which is then the one to load). Collective, as ``LocalTier.decide``."""
    decision = tier.decide()
    if decision is None:
        return None
    if persistent is not None and decision.step < persistent:
        logger.info("local step %d is older than persistent step %d, which is loaded",
                    decision.step, persistent)
        return None
    values = load(tier, decision, named_parts.to_load(target), partial=partial, options=options)
    return decision.step, named_parts.loaded(target, values)


def load(tier, decision: Decision, targets: Mapping[str, Any] | None, *, partial: bool,
         options: options_lib.Options) -> dict[str, Any]:
    """Loads step ``decision.step`` from the slices (collective), reported as
    a load of this process's root (``shardkeep.base.events``).

    ``tier`` is the manager's ``LocalTier`` (for this process's index, the
    process count, the root and the timeout); ``targets`` maps
    checkpointable names to targets as in ``shardkeep.load_checkpointables``.
    """
    with events.loading(tier.root) as report:
        return report.loaded(_load(tier, decision, targets, partial=partial, options=options))


def _load(tier, decision: Decision, targets: Mapping[str, Any] | None, *, partial: bool,
          options: options_lib.Options) -> dict[str, Any]:
    started = time.monotonic()
    core_options = options.to_core()
    slices, values = _gather_descriptions(tier, decision, core_options)
    first = slices[0]
    parts = {p.name: p for p in first.parts}
    if targets is None:
        targets = {name: None for name in parts}
    if not isinstance(targets, Mapping):
        raise InvalidArgumentError(
            f"targets must map checkpointable names to targets, got {type(targets).__name__}")
    where = f"local step {decision.step} under {tier.root}"
    for name in targets:
        if name == named_parts.STATE and name not in parts:
            names = sorted(parts)
            raise named_parts.no_state(
                where, names, "manager.restore(sk.Checkpointables("
                f"{named_parts.listing(names)})), or an empty sk.Checkpointables() for all")
        if name not in parts:
            raise NotFoundError(f"{where} has no checkpointable {name!r}; it has"
                                f" {sorted(parts)}")
    # Which stored box of which slice holds each part of each leaf (the
    # slice's description has a SliceShard per stored box).
    stored: dict[str, dict[int, list[Stored]]] = {}
    for q, description in slices.items():
        for part in description.parts:
            by_leaf = stored.setdefault(part.name, {})
            for k, shard in enumerate(part.shards):
                by_leaf.setdefault(shard.leaf, []).append(Stored(q, k, shard.origin, shard.shape))
    files = {name: f"{where}/{name}/meta.json" for name in targets}
    # No load-and-broadcast: the fetch below already reads each piece once.
    plans = {name: load_plan.plan(f"{where}/{name}",
                                  _core.decode_pytree_meta(parts[name].meta, files[name]),
                                  target, partial=partial, broadcast=False,
                                  allow_lossy_cast=options.allow_lossy_cast,
                                  donate=options.donate_target)
             for name, target in targets.items() if parts[name].kind == "pytree"}
    requests = {name: [Box(slot.number, dtypes.name_of(slot.dtype), slot.origin, slot.shape)
                       for slot in plan.slots()] for name, plan in plans.items()}
    pieces = _cut(where, requests, stored)
    fetched = _fetch(tier, decision, pieces, core_options)
    results = {}
    for name, target in targets.items():
        kind = parts[name].kind
        if kind == "pytree":
            source = _PiecesSource(f"{where}/{name}", name, pieces[name], fetched)
            value = load_executor.execute(plans[name], source, timeout_s=tier.timeout_s)
        elif target is not None:
            raise InvalidArgumentError(f"{where}/{name} is of kind {kind!r}, which takes"
                                       " no target")
        elif kind == "json":
            value = json.loads(values[name])
        else:
            value = values[name]
        registered = _core.registered_kind(parts[name].meta, files[name])
        results[name] = checkpointables.decode(registered, value)
    logger.info("restored local step %d in %.3f s", decision.step,
                time.monotonic() - started)
    return results


def _gather_descriptions(tier, decision: Decision, core_options
                         ) -> tuple[dict[int, local_slices.Description], dict[str, bytes]]:
    """Every slice's description, and the json/bytes values (collective:
    each slice's server sends its description to the others)."""
    slices: dict[int, local_slices.Description] = {}
    values: dict[str, bytes] = {}
    readers = {q: _core.Reader(path, core_options) for q, path in decision.paths.items()}
    for q, reader in readers.items():
        slices[q] = local_slices.Description.decode(
            reader.read_value(local_slices.SLICE_PART),
            f"{decision.paths[q]}/{local_slices.SLICE_PART}")
    if readers:
        q, reader = next(iter(readers.items()))
        values = {p.name: reader.read_value(p.name) for p in slices[q].parts
                  if p.kind != "pytree"}
    if tier.count > 1:
        outgoing: dict[int, list[np.ndarray]] = {}
        for q, holders in decision.holders.items():
            if decision.server(q) != tier.me:
                continue
            description = slices[q].encoded()
            for p in range(tier.count):
                if p not in holders:
                    outgoing.setdefault(p, []).append(description)
        value_sender = min(h[0] for h in decision.holders.values())
        if value_sender == tier.me:
            for p in range(tier.count):
                if not any(p in h for h in decision.holders.values()):
                    outgoing.setdefault(p, []).extend(
                        [local_slices.json_bytes(sorted(values)),
                         *[np.frombuffer(values[n], np.uint8) for n in sorted(values)]])
        received = exchange.exchange_bytes(
            outgoing, name=f"local restore of {tier.job}, step {decision.step}: descriptions",
            timeout_s=tier.timeout_s)
        for sender, buffers in received.items():
            i = 0
            while i < len(buffers):
                message = buffers[i].tobytes()
                i += 1
                if message.startswith(b"["):  # the names of the values that follow
                    for name in json.loads(message):
                        values[name] = buffers[i].tobytes()
                        i += 1
                else:
                    got = local_slices.Description.decode(
                        message, f"a slice description process {sender} sent")
                    if got.process is None:
                        raise CorruptionError(f"process {sender} sent the description of a"
                                              " slice that names no process")
                    slices[got.process] = got
    missing = [q for q in range(decision.process_count) if q not in slices]
    if missing:
        raise ShardkeepError(f"local step {decision.step}: no description of slices"
                             f" {missing} arrived")
    return slices, values


def _fetch(tier, decision: Decision, pieces: dict[str, dict[Box, list[Piece]]],
           core_options: _core.Options) -> dict[PieceKey, np.ndarray]:
    """The bytes of every piece: read here, or from its slice's holder
    (collective: requests go out in one exchange, bytes come back in
    another)."""
    wanted: dict[int, list[PieceKey]] = {}
    for name, by_request in pieces.items():
        for request, request_pieces in by_request.items():
            for piece in request_pieces:
                key = PieceKey(name, piece.slice, piece.leaf, piece.origin, piece.shape,
                               request.dtype)
                q = piece.slice
                holder = tier.me if tier.me in decision.holders[q] else decision.server(q)
                wanted.setdefault(holder, []).append(key)
    for holder in wanted:
        wanted[holder] = sorted(set(wanted[holder]))
    fetched = _read_pieces(tier, decision, wanted.pop(tier.me, []), core_options)
    if tier.count == 1:
        return fetched
    asked = exchange.exchange_bytes(
        {h: [local_slices.json_bytes(keys)] for h, keys in wanted.items()},
        name=f"local restore of {tier.job}, step {decision.step}: requests",
        timeout_s=tier.timeout_s)
    replies = {}
    for asker, (asking,) in asked.items():
        keys = [PieceKey(n, q, k, tuple(o), tuple(s), d) for n, q, k, o, s, d in
                json.loads(asking.tobytes())]
        served = _read_pieces(tier, decision, keys, core_options)
        replies[asker] = [dtypes.as_bytes(served[key]) for key in keys]
    answers = exchange.exchange_bytes(
        replies, name=f"local restore of {tier.job}, step {decision.step}: pieces",
        timeout_s=tier.timeout_s)
    for holder, keys in wanted.items():
        got = answers.get(holder, [])
        if len(got) != len(keys):
            raise ShardkeepError(f"local step {decision.step}: process {holder} sent"
                                 f" {len(got)} of the {len(keys)} pieces asked")
        for key, data in zip(keys, got):
            fetched[key] = data.view(dtypes.from_name(key.dtype)).reshape(key.shape)
    return fetched


def _read_pieces(tier, decision: Decision, keys: list[PieceKey],
                 core_options: _core.Options) -> dict[PieceKey, np.ndarray]:
    """Reads pieces of slices held here: one read call per slice and part."""
    out: dict[PieceKey, np.ndarray] = {}
    groups: dict[tuple[int, str], list[PieceKey]] = {}
    for key in keys:
        groups.setdefault((key.slice, key.part), []).append(key)
    for (q, name), group in groups.items():
        if q not in decision.paths:
            raise ShardkeepError(f"local step {decision.step}: slice {q} was asked of"
                                 f" process {tier.me}, which does not hold it")
        reader = _core.Reader(decision.paths[q], core_options)
        requests = []
        for key in group:
            buffer = np.empty(key.shape, dtypes.from_name(key.dtype))
            out[key] = buffer
            requests.append(_core.ReadRequest(key.leaf, key.dtype, key.origin, key.shape,
                                              dtypes.as_bytes(buffer)))
        reader.read(name, requests, core_options)
    return out


def _cut(where: str, requests: dict[str, list[Box]],
         stored: dict[str, dict[int, list[Stored]]]) -> dict[str, dict[Box, list[Piece]]]:
    """Each request cut into the stored boxes it overlaps."""
    out: dict[str, dict[Box, list[Piece]]] = {}
    for name, part_requests in requests.items():
        by_request = out.setdefault(name, {})
        for request in part_requests:
            leaf, origin, shape = request.leaf, request.origin, request.shape
            pieces: list[Piece] = []
            covered = 0
            for q, k, box_origin, box_shape in stored.get(name, {}).get(leaf, []):
                lo = [max(a, b) for a, b in zip(origin, box_origin)]
                hi = [min(a + n, b + m) for a, n, b, m in
                      zip(origin, shape, box_origin, box_shape)]
                if any(h <= l for l, h in zip(lo, hi)):
                    continue  # disjoint (a 0-d leaf's one box always overlaps)
                sub_shape = tuple(h - l for l, h in zip(lo, hi))
                pieces.append(Piece(q, k, tuple(l - b for l, b in zip(lo, box_origin)),
                                    sub_shape, tuple(l - o for l, o in zip(lo, origin))))
                covered += math.prod(sub_shape)
            if covered != math.prod(shape):
                raise IncompatibleError(
                    f"{where}/{name}: the slices cover {covered} of the {math.prod(shape)}"
                    f" elements of box {list(origin)}+{list(shape)} of leaf {leaf}")
            by_request[request] = pieces
    return out


class _PiecesSource(load_source.Source):
    """The fetched pieces of one checkpointable, as a load's source: a read
    copies the pieces of each planned box into its buffer."""

    def __init__(self, where: str, name: str, pieces: dict[Box, list[Piece]],
                 fetched: dict[PieceKey, np.ndarray]):
        self.where = where
        self._name = name
        self._pieces = pieces
        self._fetched = fetched

    def read(self, requests: list[_core.ReadRequest]) -> None:
        for request in requests:
            box = Box(request.leaf, request.dtype, tuple(request.origin), tuple(request.shape))
            if box not in self._pieces:
                raise ShardkeepError(f"{self.where}: box {request.origin}+{request.shape}"
                                     f" of leaf {request.leaf} was not planned")
            filled = load_source.destination(request).view(
                dtypes.from_name(box.dtype)).reshape(box.shape)
            for piece in self._pieces[box]:
                data = self._fetched[PieceKey(self._name, piece.slice, piece.leaf, piece.origin,
                                              piece.shape, box.dtype)]
                filled[tuple(slice(a, a + n) for a, n in zip(piece.at, piece.shape))] = data
