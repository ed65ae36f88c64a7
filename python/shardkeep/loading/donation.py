"""Loading into the memory of the arrays a load replaces (``donate=True``).

A job that loads again and again (evaluation after training, serving that
picks up new weights, a restart within one process) would otherwise fill
fresh pages each time, and on virtual machines the kernel's first touch of
a fresh page costs more than the copy into it. A donated target leaf's
memory is reused instead: its boxes are read straight into it.

Reuse is safe only where nothing else can see that memory. JAX's own
donation decides: the leaf goes through a jitted identity that donates
its input. Where XLA owns the buffers and no one holds a view of them (no
``np.asarray`` of the array is alive, it does not wrap a caller's numpy
array), the output keeps the input's memory and the caller's array is
deleted, so the caller can no longer see the bytes being replaced; where
it does not, the output is a copy, and the caller's array is left as it
was. Either way the identity's output, which no one else holds, is the
array the load fills and returns.

Arrays that a load placed in host memory of shardkeep's own (a file
mapping, a load's buffers, adopted by XLA without a copy) are not XLA's to
give up: the identity would copy them, only to have the copy overwritten.
Such donors are recognised (``note_placed``) and deleted instead, and their
leaves load as any other (mapped again, or read into new buffers); the
arrays of that load are then XLA's own only if a computation made them.

The CPU backend's device memory is host memory, so only there can the
reads go straight into it; on other backends the donated arrays are
deleted before their leaves are placed, so that the device holds one copy
of the state at a time, not two.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import numpy as np

from .load_plan import LeafPlan, Slot


# One call donates every leaf of a load (one dispatch, compiled once per
# tree of shapes and shardings): an identity whose outputs keep the
# inputs' memory where XLA can give it up.
_identity = jax.jit(lambda arrays: arrays, donate_argnums=0)


# id -> weak reference of each array a load placed in shardkeep's own host
# memory, dropped when the array is (jax arrays are not hashable).
_placed: dict[int, weakref.ref] = {}


def note_placed(array: jax.Array) -> jax.Array:
    """Remembers that ``array`` lives in memory a load handed to XLA."""
    key = id(array)

    def forget(_: weakref.ref) -> None:
        _placed.pop(key, None)

    _placed[key] = weakref.ref(array, forget)
    return array


def _placed_by_a_load(array: jax.Array) -> bool:
    ref = _placed.get(id(array))
    return ref is not None and ref() is array


def take(leaves: list[LeafPlan]) -> dict[LeafPlan, jax.Array]:
    """Takes the donors of ``leaves`` (SHARDED, each with one): returns,
    for each leaf whose donor's memory can be reused, an array of the
    load's own to be given its boxes by ``attach``; the other donors are
    deleted (those leaves are placed in new memory)."""
    on_host = [leaf for leaf in leaves
               if _on_host(leaf) and not _placed_by_a_load(leaf.donor)]
    reused = set(on_host)
    for leaf in leaves:
        if leaf not in reused:
            leaf.donor.delete()
    owned = jax.block_until_ready(_identity([leaf.donor for leaf in on_host]))
    return dict(zip(on_host, owned))


def attach(leaf: LeafPlan, array: jax.Array, buffers: dict[Slot, np.ndarray],
           copies: dict[Slot, list[np.ndarray]]) -> bool:
    """Gives the slots of a taken leaf buffers in its ``array``'s memory
    (and each box's copies on its other devices); False, giving nothing,
    where that memory is not laid out as the boxes are (the leaf is then
    placed as any other)."""
    memory = {shard.device: shard.data for shard in array.addressable_shards}
    views = [[_writable(memory[device], slot) for device in slot.holders()] for slot in leaf.slots]
    usable = [[view for view in slot_views if view is not None] for slot_views in views]
    if any(len(kept) != len(slot_views) for kept, slot_views in zip(usable, views)):
        return False
    for slot, (first, *others) in zip(leaf.slots, usable):
        buffers[slot], copies[slot] = first, others
    return True


def finish(leaf: LeafPlan, array: jax.Array, buffers: dict[Slot, np.ndarray],
           copies: dict[Slot, list[np.ndarray]]) -> jax.Array:
    """The donated ``array``, its boxes read; copies each box to the other
    devices that hold it, then drops the views of its memory."""
    for slot in leaf.slots:
        for copy in copies.pop(slot, []):
            np.copyto(copy, buffers[slot])
        del buffers[slot]
    return array


def _on_host(leaf: LeafPlan) -> bool:
    donor = leaf.donor
    assert donor is not None
    return (donor.sharding == leaf.sharding
            and all(device.platform == "cpu" for device in donor.sharding.device_set))


class _Memory:
    """A CPU device array's memory as a numpy array interface, writable,
    keeping the device array (and so its memory) alive as long as the
    numpy array viewing it."""

    def __init__(self, device_array: Any, slot: Slot):
        self._array = device_array
        self.__array_interface__ = {
            "shape": slot.shape, "typestr": slot.dtype.str,
            "data": (device_array.unsafe_buffer_pointer(), False), "version": 3}


def _writable(device_array: Any, slot: Slot) -> np.ndarray | None:
    """A writable numpy array over a CPU device array's own memory, or None
    where its layout is not the box's in C order."""
    if (tuple(device_array.shape) != slot.shape or device_array.dtype != slot.dtype
            or device_array.format.layout.major_to_minor != tuple(range(len(slot.shape)))):
        return None
    # The interface spells ml_dtypes' types as raw bytes (V2): view them back.
    return np.asarray(_Memory(device_array, slot)).view(slot.dtype)
