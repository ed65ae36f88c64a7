"""The device-to-host copies of the boxes a save writes from an accelerator.

``start`` starts every copy before any is waited for; ``host_views`` waits
for a leaf's and gives the host arrays the core carves chunks out of. On
GPUs the copies go into pinned host memory (``Options.pinned_host_staging``;
docs/ACCELERATORS.md).
"""

from __future__ import annotations

import functools
import logging

import jax
import numpy as np

logger = logging.getLogger("shardkeep")


def start(views: list[list], pinned_host: bool | None) -> None:
    """Starts the device-to-host copy of every array in ``views`` before
    any is waited for.

    Where pinned: one batched ``jax.device_put`` into each device's
    ``pinned_host`` memory, whose arrays replace the device ones in
    ``views`` (numpy views of them are zero-copy: JAX reports pinned
    buffers as host memory). The DMA engines write pinned memory at the
    link's speed, where a copy into pageable memory goes through a bounce
    buffer and first touches fresh pages; the pinned memory goes back to
    the runtime's host allocator when the save ends. Otherwise
    each array's ``copy_to_host_async``: the runtime's own pageable copy,
    also where the runtime refuses the pinned copies (its pinned pool
    exhausted, say), which is logged.
    """
    arrays = [(i, j, a, _pinned_sharding(a.device, pinned_host))
              for i, of_leaf in enumerate(views) for j, a in enumerate(of_leaf)]
    to_pin = [(i, j, a, sharding) for i, j, a, sharding in arrays if sharding is not None]
    pinned = _put_pinned(to_pin) if to_pin else None
    if pinned is not None:
        for (i, j, _, _), host_array in zip(to_pin, pinned):
            views[i][j] = host_array
    for _, _, a, sharding in arrays:
        if sharding is None or pinned is None:
            a.copy_to_host_async()


def _put_pinned(to_pin: list) -> list | None:
    """The arrays' copies in pinned memory, all started by one call; None
    (logged) where the runtime refuses them."""
    try:
        return jax.device_put([a for _, _, a, _ in to_pin],
                              [sharding for _, _, _, sharding in to_pin])
    except (ValueError, TypeError, RuntimeError) as e:
        logger.warning("shardkeep: staging through pageable host memory: the copies into"
                       " pinned host memory failed: %s", e)
        return None


@functools.lru_cache(maxsize=64)
def _pinned_sharding(device, pinned_host: bool | None):
    """The sharding that places an array in ``device``'s pinned host
    memory, if staging uses it: where asked to (``pinned_host``), or by
    default on GPUs, and only where the device has such memory. TPUs stage
    through pageable memory by default: their pinned host memory is a
    smaller, device-managed pool (Orbax makes the same choice)."""
    wanted = pinned_host if pinned_host is not None else device.platform == "gpu"
    if not wanted or not any(m.kind == "pinned_host" for m in device.addressable_memories()):
        return None
    return jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")


def host_views(on_host: bool, views: list) -> list:
    """The host arrays of a leaf's views: themselves where they are in host
    memory, else their device-to-host copies (waited for here; a pinned
    copy's numpy view is zero-copy)."""
    return views if on_host else [np.asarray(a) for a in views]
