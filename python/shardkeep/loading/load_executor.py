"""Running a ``LoadPlan`` against a source, as a pipeline.

The boxes this process reads are asked of the source in batches of whole
leaves, each batch in one call so that its reads run in parallel and
stored chunks shared by several boxes of a leaf are fetched once. While
the source fills one batch on a background thread, the leaves of the
batch before are placed on their devices (``placement``): placement never
waits for every read, and reading never waits for placement.

Each unique box is read once, whatever number of local devices hold it;
with a load-and-broadcast plan, boxes that several processes hold are read
once in the whole job and sent to the other holders: the
load-and-broadcast stage (``broadcast_load``), which the executor adds
when the plan asks for it and which needs every read done before the
exchange, so such a load is one batch. The plan is not changed: what a
run chooses (buffers, donated memory, pieces) is the run's (``_Run``). Boxes the source can map from files are not read at all
(``file_mapping``); they are checked against their checksums while the
batches are read.
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any, Sequence

import jax
import numpy as np

from .. import _core
from .. import options as options_lib
from ..base import dtypes, host_memory, prng_keys, unchanged
from ..base.gc_pause import gc_paused
from . import broadcast_load, donation, load_plan, placement
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


def load_with(source: Source, target: Any, *, path: str, partial: bool,
              options: options_lib.Options) -> Any:
    """``load`` with ``options``' casts, timeout and donation, broadcast
    when they ask it for ``path``, and the garbage collector paused."""
    with gc_paused():
        return load(source, target, partial=partial, broadcast=options.broadcasts_load_of(path),
                    allow_lossy_cast=options.allow_lossy_cast, timeout_s=options.timeout_s,
                    donate=options.donate_target)


class _Run:
    """What one execution of a plan chooses as it goes (the plan itself
    never changes): each slot's host array (mapped from a file, the memory
    of a donated array, or allocated and read), the donated leaves' arrays
    of the load's own, and each donated box's copies on other devices."""

    def __init__(self):
        self.arena = host_memory.Arena()
        self.buffers: dict[Slot, np.ndarray] = {}
        self.donors: dict[LeafPlan, jax.Array] = {}
        self.copies: dict[Slot, list[np.ndarray]] = {}


def execute(plan: LoadPlan, source: Source, *, timeout_s: float) -> Any:
    """Fills the plan's slots from ``source`` and builds the tree.
    ``timeout_s`` bounds each wait for other processes (load-and-broadcast)."""
    run = _Run()
    sharing = _sharing(plan, source) if plan.broadcast else None
    shared = sharing.shared_slots() if sharing is not None else set()
    mapped, to_read = _choose_buffers(plan, source, shared, run)
    if sharing is None:
        batches = _batches(plan.leaves, to_read)
        pieces = []
    else:
        batches = [(list(plan.leaves), [s for s in plan.slots() if s in to_read])]
        pieces = [_core.ReadRequest(slot.number, dtypes.name_of(slot.dtype), origin, shape,
                                    dtypes.as_bytes(buffer))
                  for slot, origin, shape, buffer in sharing.own_pieces(run.buffers)]
    values: dict[LeafPlan, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(2, "shardkeep-load") as background:
        verified = background.submit(mapped.verify)
        reading = background.submit(read_batch, source, _requests(*batches[0], run) + pieces)
        for i, (leaves, _) in enumerate(batches):
            reading.result()
            if i + 1 < len(batches):
                reading = background.submit(read_batch, source, _requests(*batches[i + 1], run))
            if sharing is not None:
                sharing.exchange(run.buffers, f"load of {source.where}", timeout_s)
            for leaf in leaves:
                values[leaf] = _finish(plan.where, leaf, run)
        verified.result()
    ordered = [values[leaf] for leaf in plan.leaves]
    if source.origin is not None:
        _remember(source, plan.leaves, ordered)
    return plan.rebuild(ordered)


def _sharing(plan: LoadPlan, source: Source) -> broadcast_load.Plan:
    """The load-and-broadcast stage of a plan: who reads each piece of the
    boxes that several processes hold (asking ``source`` where its stored
    chunks lie), in the same order in every process."""
    sharing = broadcast_load.Plan(jax.process_index())
    for leaf in plan.leaves:
        if leaf.finish is Finish.SHARDED:
            assert leaf.dtype is not None  # planned with one
            key_shape = prng_keys.key_shape(leaf.key_impl) if leaf.key_impl else ()
            sharing.add_leaf(leaf.number, leaf.path, leaf.sharding, leaf.shape, key_shape,
                             leaf.dtype, leaf.slots)
    sharing.choose_readers(source)
    return sharing


def _choose_buffers(plan: LoadPlan, source: Source, shared: set[Slot],
                    run: _Run) -> tuple[Verify, set[Slot]]:
    """Takes the donated leaves' memory, maps what the source can map and
    allocates the rest; returns the mapped boxes (to verify) and the slots
    to read. A taken donor's slots get their buffers batch by batch
    (``_requests``)."""
    donated = [leaf for leaf in plan.leaves if leaf.donor is not None]
    if donated:
        run.donors = donation.take(donated)
    into_donor = {s for leaf in run.donors for s in leaf.slots}
    own = [slot for slot in plan.slots() if slot not in shared]
    unfilled = [slot for slot in own if slot not in into_donor]
    mapped = source.map_boxes(unfilled, run.buffers)
    to_read = set(own) - set(run.buffers)
    for slot in plan.slots():
        if slot not in run.buffers and slot not in into_donor:
            run.buffers[slot] = run.arena.empty(slot.shape, slot.dtype)
    return mapped, to_read


def _batches(leaves: Sequence[LeafPlan], to_read: set[Slot]
             ) -> list[tuple[list[LeafPlan], list[Slot]]]:
    """``leaves`` cut into runs of whole leaves, each with its slots to read."""
    total = sum(_nbytes(s) for leaf in leaves for s in leaf.slots if s in to_read)
    batch_bytes = max(_MIN_BATCH_BYTES, total // _BATCHES)
    batches: list[tuple[list[LeafPlan], list[Slot]]] = []
    run: list[LeafPlan] = []
    reads: list[Slot] = []
    size = 0
    for leaf in leaves:
        run.append(leaf)
        for slot in leaf.slots:
            if slot in to_read:
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


def _requests(leaves: list[LeafPlan], reads: list[Slot], run: _Run) -> list[_core.ReadRequest]:
    """The reads of a batch (each slot into its buffer), once its donated
    leaves have their buffers."""
    for leaf in leaves:
        if leaf in run.donors and not donation.attach(leaf, run.donors[leaf], run.buffers,
                                                      run.copies):
            del run.donors[leaf]  # placed as any other leaf, in new memory
            for slot in leaf.slots:
                run.buffers[slot] = run.arena.empty(slot.shape, slot.dtype)
    return [_core.ReadRequest(slot.number, dtypes.name_of(slot.dtype), slot.origin, slot.shape,
                              dtypes.as_bytes(run.buffers[slot])) for slot in reads]


def read_batch(source: Source, requests: list[_core.ReadRequest]) -> None:
    """Fills one batch's requests (on the pipeline's background thread)."""
    if requests:
        source.read(requests)


def _remember(source: Source, leaves: Sequence[LeafPlan], values: list) -> None:
    """Notes where the arrays loaded without a cast are stored, so that a
    save based on this checkpoint takes them from there
    (``shardkeep.base.unchanged``)."""
    assert source.origin is not None
    stored = source.meta().leaves
    for leaf, value in zip(leaves, values):
        if (leaf.finish is Finish.SHARDED and leaf.slots
                and unchanged.worth_remembering(value)
                and all(dtypes.name_of(slot.dtype) == stored[slot.number].dtype
                        for slot in leaf.slots)):
            unchanged.note_loaded(value, source.origin, leaf.path)


def _finish(where: str, leaf: LeafPlan, run: _Run) -> Any:
    finish = leaf.finish
    if finish is Finish.SHARDED:
        if leaf in run.donors:
            return donation.finish(leaf, run.donors.pop(leaf), run.buffers, run.copies)
        return donation.note_placed(placement.place(leaf, run.buffers, run.arena))
    if finish is Finish.VALUE:
        return leaf.value
    if finish is Finish.HOST:
        return run.buffers[leaf.slots[0]]
    if finish is Finish.ITEM:
        return run.buffers[leaf.slots[0]].item()
    host = leaf.value if leaf.value is not None else run.buffers[leaf.slots[0]]
    target = leaf.target
    if isinstance(target, np.generic):
        return host[()]
    if isinstance(target, np.ndarray):
        return host
    return jax.device_put(host, load_plan.target_sharding(where, leaf.path, target))
