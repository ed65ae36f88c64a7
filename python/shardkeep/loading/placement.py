"""Placing a leaf's filled host boxes on their devices as one jax.Array.

One ``jax.make_array_from_callback`` per leaf builds every device's array
in a single call into XLA, where ``jax.device_put`` of a list of boxes
followed by ``make_array_from_single_device_arrays`` pays a call per box,
which dominated loads of many small boxes (docs/DESIGN_NOTES.md, "The load
pipeline", has the figures). On the CPU backend a 64-byte aligned box is
adopted as the device's buffer, not copied.

No two devices' arrays share memory, so that a jit donating one of them
cannot write into another: a box that several devices hold goes to the
first as it is and to the others as copies (JAX itself would hand the
same host buffer to every holder).
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from ..base import host_memory, prng_keys, shardings
from .load_plan import LeafPlan, Slot


def place(leaf: LeafPlan, buffers: Mapping[Slot, np.ndarray],
          arena: host_memory.Arena) -> jax.Array:
    """The jax.Array of a SHARDED leaf whose slots' ``buffers`` are filled."""
    sharding, shape = leaf.sharding, leaf.shape
    assert sharding is not None  # planned with one
    if leaf.key_impl:
        return _place_keys(leaf, buffers)
    if not leaf.slots:  # none of its devices is this process's
        return jax.make_array_from_single_device_arrays(shape, sharding, [])
    first = leaf.slots[0]
    if len(leaf.slots) == 1 and len(first.holders()) > 1 and sharding.is_fully_replicated:
        # make_array_from_callback would give every device the same buffer.
        if sharding.is_fully_addressable:  # device_put copies to the others
            return jax.device_put(_on_one_device(buffers[first], first.holders()[0]), sharding)
        return jax.make_array_from_single_device_arrays(shape, sharding,
                                                        _per_device(first, buffers[first]))
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return _on_one_device(buffers[first], first.holders()[0])
    by_box: dict = {}
    for slot in leaf.slots:
        copies = [buffers[slot]]
        for _ in slot.holders()[1:]:
            copy = arena.empty(slot.shape, slot.dtype)
            np.copyto(copy, buffers[slot])
            copies.append(copy)
        by_box[(slot.origin, slot.shape)] = copies
    return jax.make_array_from_callback(
        shape, sharding, lambda index: by_box[shardings.box_of_index(index, shape)].pop(),
        dtype=first.dtype)


def _on_one_device(buffer: np.ndarray, device) -> jax.Array:
    return jax.make_array_from_callback(buffer.shape, jax.sharding.SingleDeviceSharding(device),
                                        lambda _: buffer, dtype=buffer.dtype)


def _per_device(slot: Slot, buffer: np.ndarray) -> list[jax.Array]:
    """The box's array on each of its devices: the first adopts its
    ``buffer``, the others are copies of the first."""
    first = _on_one_device(buffer, slot.holders()[0])
    return [first] + [jax.device_put(first, device) for device in slot.holders()[1:]]


def _place_keys(leaf: LeafPlan, buffers: Mapping[Slot, np.ndarray]) -> jax.Array:
    """Typed keys, assembled from their per-device key data in the
    sharding's device order (unlike plain arrays); rare enough to place
    box by box."""
    sharding, shape = leaf.sharding, leaf.shape
    assert sharding is not None and leaf.key_impl is not None
    arrays = [array for slot in leaf.slots for array in _per_device(slot, buffers[slot])]
    order = {d: i for i, d in enumerate(sharding.addressable_devices_indices_map(shape))}
    arrays.sort(key=lambda a: order[next(iter(a.devices()))])
    keys = [prng_keys.wrap(a, leaf.key_impl) for a in arrays]
    if len(keys) == 1 and isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return keys[0]
    return jax.make_array_from_single_device_arrays(shape, sharding, keys)
