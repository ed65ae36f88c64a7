"""Running a ``LoadPlan`` against a source.

Every box this process reads, of every leaf, is asked of the source in one
call, so that the reads run in parallel and stored chunks shared by
several boxes are fetched once. Each unique box is read once, whatever
number of local devices hold it; with a load-and-broadcast plan, boxes
that several processes hold are read once in the whole job and sent to the
other holders (``broadcast_load``). Boxes the source can map from files
are not read at all (``file_mapping``).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import _core
from ..base import dtypes, host_memory, prng_keys, unchanged
from . import load_plan
from .load_plan import Finish, LeafPlan, LoadPlan
from .load_source import Source


def load(source: Source, target: Any, *, partial: bool, broadcast: bool,
         timeout_s: float) -> Any:
    """Plans the load of ``source``'s tree onto ``target`` and runs it."""
    plan = load_plan.plan(source.where, source.meta(), target, partial=partial,
                          broadcast=broadcast)
    return execute(plan, source, timeout_s=timeout_s)


def execute(plan: LoadPlan, source: Source, *, timeout_s: float) -> Any:
    """Fills the plan's slots from ``source`` and builds the tree.
    ``timeout_s`` bounds each wait for other processes (load-and-broadcast)."""
    slots = plan.slots()
    sharing = plan.sharing
    shared: set[int] = set()
    if sharing is not None:
        sharing.choose_readers(source)
        shared = sharing.shared_slots()
    own = [slot for slot in slots if id(slot) not in shared]
    mapped = source.map_boxes(own)
    to_read = [slot for slot in own if slot.buffer is None]
    arena = host_memory.Arena()
    for slot in slots:
        if slot.buffer is None:
            slot.buffer = arena.empty(slot.shape, slot.dtype)
    requests = [slot.request() for slot in to_read]
    if sharing is not None:
        requests += [_core.ReadRequest(slot.number, dtypes.name_of(slot.dtype), origin, shape,
                                       dtypes.as_bytes(buffer))
                     for slot, origin, shape, buffer in sharing.own_pieces()]
    if requests:
        source.read(requests)
    mapped.verify()
    if sharing is not None:
        sharing.exchange(f"load of {source.where}", timeout_s)
    puts = _DevicePuts()
    for slot in slots:
        if slot.devices is not None:
            slot.placed = puts.add(slot.buffer, slot.devices)
    puts.run()
    values = [_finish(plan.where, leaf, puts) for leaf in plan.leaves]
    if source.origin is not None:
        _remember(source, plan.leaves, values)
    return plan.rebuild(values)


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


def _finish(where: str, leaf: LeafPlan, puts: "_DevicePuts") -> Any:
    finish = leaf.finish
    if finish is Finish.SHARDED:
        return _assemble(leaf, puts)
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


def _assemble(leaf: LeafPlan, puts: "_DevicePuts") -> jax.Array:
    arrays = [a for slot in leaf.slots for a in puts.arrays(slot.placed)]
    sharding, shape = leaf.sharding, leaf.shape
    assert sharding is not None  # planned with one
    if leaf.key_impl:
        # Typed keys are assembled from their per-device data in the
        # sharding's device order, unlike plain arrays.
        order = {d: i for i, d in enumerate(sharding.addressable_devices_indices_map(shape))}
        arrays.sort(key=lambda a: order[next(iter(a.devices()))])
        arrays = [prng_keys.wrap(a, leaf.key_impl) for a in arrays]
    if len(arrays) == 1 and isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return arrays[0]  # already the requested array
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


class _DevicePuts:
    """Host buffers to place on devices, placed by two batched device_put
    calls for the whole tree instead of one call per shard (the per-call
    overhead dominates loads of many small leaves).

    device_put of a numpy array may alias it on the CPU backend, so a buffer
    goes to its first device only; the other devices that hold the same box
    get copies of that device's array, so that no two shards share memory.
    """

    def __init__(self):
        self._buffers: list[np.ndarray] = []
        self._firsts: list = []
        self._others: list[tuple[int, Any]] = []
        self._first_arrays: list = []
        self._other_arrays: list = []

    def add(self, buffer: np.ndarray, devices: list) -> tuple[int, list[int]]:
        """Schedules ``buffer`` onto ``devices``; returns keys for ``arrays``."""
        first = len(self._buffers)
        self._buffers.append(buffer)
        self._firsts.append(devices[0])
        others = []
        for device in devices[1:]:
            others.append(len(self._others))
            self._others.append((first, device))
        return first, others

    def run(self) -> None:
        self._first_arrays = jax.device_put(self._buffers, self._firsts)
        self._other_arrays = jax.device_put(
            [self._first_arrays[i] for i, _ in self._others], [d for _, d in self._others])

    def arrays(self, key: tuple[int, list[int]]) -> list:
        first, others = key
        return [self._first_arrays[first]] + [self._other_arrays[i] for i in others]
