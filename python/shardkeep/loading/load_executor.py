"""Running a ``LoadPlan`` against a source, as a pipeline.

The boxes this process reads are asked of the source in batches of whole
leaves, each batch in one call so that its reads run in parallel and
stored chunks shared by several boxes of a leaf are fetched once. While
the source fills one batch on a background thread, the leaves of the
batch before are placed on their devices (``placement``): placement never
waits for every read, and reading never waits for placement.

Each unique box is read once, whatever number of local devices hold it;
with a load-and-broadcast plan, boxes that several processes hold are read
once in the whole job and sent to the other holders (``broadcast_load``),
which needs every read done before the exchange, so such a load is one
batch. Boxes the source can map from files are not read at all
(``file_mapping``); they are checked against their checksums while the
batches are read.
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any

import jax
import numpy as np

from .. import _core
from ..base import dtypes, host_memory, unchanged
from . import donation, load_plan, placement
from .load_plan import Finish, LeafPlan, LoadPlan, Slot
from .load_source import Source, Verify

# A batch holds whole leaves, about 1/_BATCHES of the bytes to read, and
# at least _MIN_BATCH_BYTES so that each of the source's reads of a batch
# has enough requests to run in parallel.
_BATCHES = 8
_MIN_BATCH_BYTES = 16 << 20


def load(source: Source, target: Any, *, partial: bool, broadcast: bool,
         allow_lossy_cast: bool, timeout_s: float, donate: bool = False) -> Any:
    """Plans the load of ``source``'s tree onto ``target`` and runs it."""
    plan = load_plan.plan(source.where, source.meta(), target, partial=partial,
                          broadcast=broadcast, allow_lossy_cast=allow_lossy_cast,
                          donate=donate)
    return execute(plan, source, timeout_s=timeout_s)


def execute(plan: LoadPlan, source: Source, *, timeout_s: float) -> Any:
    """Fills the plan's slots from ``source`` and builds the tree.
    ``timeout_s`` bounds each wait for other processes (load-and-broadcast)."""
    sharing = plan.sharing
    shared: set[int] = set()
    if sharing is not None:
        sharing.choose_readers(source)
        shared = sharing.shared_slots()
    arena = host_memory.Arena()
    mapped, to_read = _choose_buffers(plan, source, shared, arena)
    if sharing is None:
        batches = _batches(plan.leaves, to_read)
        pieces = []
    else:
        batches = [(plan.leaves, [s for s in plan.slots() if id(s) in to_read])]
        pieces = [_core.ReadRequest(slot.number, dtypes.name_of(slot.dtype), origin, shape,
                                    dtypes.as_bytes(buffer))
                  for slot, origin, shape, buffer in sharing.own_pieces()]
    values: dict[int, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(2, "shardkeep-load") as background:
        verified = background.submit(mapped.verify)
        reading = background.submit(read_batch, source, _requests(*batches[0], arena) + pieces)
        for i, (leaves, _) in enumerate(batches):
            reading.result()
            if i + 1 < len(batches):
                reading = background.submit(read_batch, source, _requests(*batches[i + 1], arena))
            if sharing is not None:
                sharing.exchange(f"load of {source.where}", timeout_s)
            for leaf in leaves:
                values[id(leaf)] = _finish(plan.where, leaf, arena)
        verified.result()
    ordered = [values[id(leaf)] for leaf in plan.leaves]
    if source.origin is not None:
        _remember(source, plan.leaves, ordered)
    return plan.rebuild(ordered)


def _choose_buffers(plan: LoadPlan, source: Source, shared: set[int],
                    arena: host_memory.Arena) -> tuple[Verify, set[int]]:
    """Takes the donated leaves' memory, maps what the source can map and
    allocates the rest; returns the mapped boxes (to verify) and the ids
    of the slots to read. A taken donor's slots get their buffers batch by
    batch (``_requests``)."""
    donated = [leaf for leaf in plan.leaves if leaf.donor is not None]
    if donated:
        donation.take(donated)
    into_donor = {id(s) for leaf in plan.leaves if leaf.donor is not None for s in leaf.slots}
    own = [slot for slot in plan.slots() if id(slot) not in shared]
    unfilled = [slot for slot in own if slot.buffer is None and id(slot) not in into_donor]
    mapped = source.map_boxes(unfilled)
    to_read = {id(slot) for slot in own} - {id(s) for s in unfilled if s.buffer is not None}
    for slot in plan.slots():
        if slot.buffer is None and id(slot) not in into_donor:
            slot.buffer = arena.empty(slot.shape, slot.dtype)
    return mapped, to_read


def _batches(leaves: list[LeafPlan], to_read: set[int]
             ) -> list[tuple[list[LeafPlan], list[Slot]]]:
    """``leaves`` cut into runs of whole leaves, each with its slots to read."""
    total = sum(_nbytes(s) for leaf in leaves for s in leaf.slots if id(s) in to_read)
    batch_bytes = max(_MIN_BATCH_BYTES, total // _BATCHES)
    batches: list[tuple[list[LeafPlan], list[Slot]]] = []
    run: list[LeafPlan] = []
    reads: list[Slot] = []
    size = 0
    for leaf in leaves:
        run.append(leaf)
        for slot in leaf.slots:
            if id(slot) in to_read:
                reads.append(slot)
                size += _nbytes(slot)
        if size >= batch_bytes:
            batches.append((run, reads))
            run, reads, size = [], [], 0
    if run or not batches:
        batches.append((run, reads))
    return batches


def _nbytes(slot: Slot) -> int:
    return math.prod(slot.shape) * slot.dtype.itemsize


def _requests(leaves: list[LeafPlan], reads: list[Slot],
              arena: host_memory.Arena) -> list[_core.ReadRequest]:
    """The reads of a batch, once its donated leaves have their buffers."""
    for leaf in leaves:
        if leaf.donor is not None:
            donation.attach(leaf, arena)
    return [slot.request() for slot in reads]


def read_batch(source: Source, requests: list[_core.ReadRequest]) -> None:
    """Fills one batch's requests (on the pipeline's background thread)."""
    if requests:
        source.read(requests)


def _remember(source: Source, leaves: list[LeafPlan], values: list) -> None:
    """Notes where the arrays loaded without a cast are stored, so that a
    save based on this checkpoint takes them from there
    (``shardkeep.base.unchanged``)."""
    assert source.origin is not None
    stored = source.meta()["leaves"]
    for leaf, value in zip(leaves, values):
        if (leaf.finish is Finish.SHARDED and leaf.slots
                and unchanged.worth_remembering(value)
                and all(dtypes.name_of(slot.dtype) == stored[slot.number]["dtype"]
                        for slot in leaf.slots)):
            unchanged.note_loaded(value, source.origin, leaf.path)


def _finish(where: str, leaf: LeafPlan, arena: host_memory.Arena) -> Any:
    finish = leaf.finish
    if finish is Finish.SHARDED:
        if leaf.donor is not None:
            return donation.finish(leaf)
        return donation.note_placed(placement.place(leaf, arena))
    if finish is Finish.VALUE:
        return leaf.value
    if finish is Finish.HOST:
        return leaf.slots[0].buffer
    if finish is Finish.ITEM:
        return leaf.slots[0].buffer.item()
    host = leaf.value if leaf.value is not None else leaf.slots[0].buffer
    target = leaf.target
    if isinstance(target, np.generic):
        return host[()]
    if isinstance(target, np.ndarray):
        return host
    return jax.device_put(host, load_plan.target_sharding(where, leaf.path, target))
