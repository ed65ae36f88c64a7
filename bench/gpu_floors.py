"""bench/gpu.py's floors: what the best plain program pays to move the
state's bytes between the accelerator, host memory and the disk.

  d2h_pinned     every leaf copied into pinned host memory, all copies
                 started before any is waited for: JAX (one batched
                 device_put into ``pinned_host``; the first call allocates
                 the pinned memory, the later ones get it back from the
                 runtime's pool) and, where there is a GPU, torch into
                 pinned buffers allocated before the clock (``copy_`` with
                 non_blocking). The floor is the fastest repeat of either.
  d2h_pageable   the same into pageable memory: JAX's copy_to_host_async
                 then np.asarray (new memory each time, as the runtime
                 allocates it), torch's ``.cpu()``
  h2d            host to device: JAX from the pageable copies and from the
                 pinned ones, torch from pinned buffers
  disk           the state's bytes written by parallel streams (each file
                 fsynced, then the folder), then read back by parallel
                 threads into reused buffers, from the page cache and cold

Each timing is a list of repeats; "seconds" is the best of them.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import floors
from page_cache import evict, files_under, warm

REPEATS = 3
MIB = 1 << 20
WRITE_BLOCK = 64 * MIB
READ_THREADS = (1, 4)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _best(times: list[float], nbytes: int) -> dict:
    best = min(times)
    return {"seconds": best, "repeats": times, "gb_per_s": nbytes / best / 1e9}


# --- device <-> host, JAX ------------------------------------------------------

def _pinned_targets(arrays: list) -> list | None:
    """Each array's sharding into its device's pinned host memory; None
    where a device has no such memory."""
    import jax
    if not all(any(m.kind == "pinned_host" for m in a.device.addressable_memories())
               for a in arrays):
        return None
    return [jax.sharding.SingleDeviceSharding(a.device, memory_kind="pinned_host")
            for a in arrays]


def jax_d2h_pinned(arrays: list, targets: list) -> tuple[dict, list]:
    """The copies' timings (the first apart: it allocates the pinned
    memory), and the last copies (the h2d floor's sources)."""
    import jax
    nbytes = sum(a.nbytes for a in arrays)
    times, copies = [], None
    for _ in range(1 + REPEATS):
        copies = None  # freed before the next copy, as a save's are
        start = time.perf_counter()
        copies = jax.block_until_ready(jax.device_put(arrays, targets))
        times.append(time.perf_counter() - start)
    return _best(times[1:], nbytes) | {"first_seconds": times[0]}, copies


def zero_copy_numpy(pinned: list) -> bool:
    """Whether np.asarray of a pinned_host array is a view (shardkeep's
    pinned staging relies on it)."""
    a = pinned[0]
    return np.asarray(a).ctypes.data == a.unsafe_buffer_pointer()


def _fresh(arrays: list) -> list:
    """Device copies of ``arrays``, made before the clock: JAX keeps the
    host copy that np.asarray makes on the array object, so a second
    np.asarray of the same array would copy nothing."""
    import jax
    import jax.numpy as jnp
    return jax.block_until_ready([jnp.copy(a) for a in arrays])


def jax_d2h_pageable(arrays: list) -> dict:
    nbytes = sum(a.nbytes for a in arrays)
    times = []
    for _ in range(REPEATS):
        fresh = _fresh(arrays)
        start = time.perf_counter()
        for a in fresh:
            a.copy_to_host_async()
        host = [np.asarray(a) for a in fresh]
        times.append(time.perf_counter() - start)
        del host, fresh
    return _best(times, nbytes)


def jax_h2d(arrays: list, pinned: list | None) -> dict:
    """From pageable numpy copies, and from the pinned copies if any."""
    import jax
    nbytes = sum(a.nbytes for a in arrays)
    devices = [a.sharding for a in arrays]
    fresh = _fresh(arrays)
    host = [np.asarray(a) for a in fresh]  # pageable, touched
    del fresh
    out = {}
    for name, sources in (("pageable", host), ("pinned", pinned)):
        if sources is None:
            continue
        times = []
        for _ in range(REPEATS):
            times.append(_timed(lambda: jax.block_until_ready(jax.device_put(sources, devices))))
        out[name] = _best(times, nbytes)
    return out


# --- device <-> host, torch -----------------------------------------------------

def torch_transfers(tensors: list) -> dict:
    """torch's d2h into pinned buffers allocated before the clock and into
    new pageable memory, and h2d from the pinned buffers."""
    import torch
    if not tensors or not tensors[0].is_cuda:
        return {"skipped": "torch sees no GPU"}
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    for buffer in pinned:  # touched before the clock
        buffer.zero_()

    def d2h_pinned():
        for dst, src in zip(pinned, tensors):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    def h2d_pinned():
        for dst, src in zip(tensors, pinned):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    out = {"d2h_pinned": _best([_timed(d2h_pinned) for _ in range(REPEATS)], nbytes)}
    pageable = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        host = [t.cpu() for t in tensors]
        pageable.append(time.perf_counter() - start)
        del host
    out["d2h_pageable"] = _best(pageable, nbytes)
    out["h2d_pinned"] = _best([_timed(h2d_pinned) for _ in range(REPEATS)], nbytes)
    return out


# --- disk -----------------------------------------------------------------------

def disk(folder: str, nbytes: int, drop_caches: bool) -> dict:
    """A durable write of ``nbytes`` and reads of them back; the files are
    removed after."""
    os.makedirs(folder, exist_ok=True)
    streams = max(1, min(os.cpu_count() or 1, 8))
    block = np.random.default_rng(0).integers(0, 256, WRITE_BLOCK, dtype=np.uint8)
    write = floors.write_streams(folder, nbytes, streams, block.data)
    out = {"write": {"seconds": write, "gb_per_s": nbytes / write / 1e9,
                     "config": f"{streams}x{WRITE_BLOCK // MIB}MiB"}}
    for cold in (False, True):
        configs, eviction = {}, None
        for threads in READ_THREADS:
            if cold:
                eviction = evict(folder, drop_caches)
            else:
                warm(folder)
            configs[f"{threads} threads"] = _read_all(folder, threads)
        best = min(configs, key=configs.get)
        out["read_cold" if cold else "read_warm"] = {
            "seconds": configs[best], "gb_per_s": nbytes / configs[best] / 1e9, "best": best,
            "configs": configs} | ({"eviction": eviction} if cold else {})
    for name in files_under(folder):
        os.remove(name)
    return out


def _read_all(folder: str, threads: int) -> float:
    parts = floors.split_files(sorted(files_under(folder)), threads)

    def read(pieces):
        buffer = bytearray(WRITE_BLOCK)
        view = memoryview(buffer)
        for piece in pieces:
            fd = os.open(piece.name, os.O_RDONLY)
            try:
                done = 0
                while done < piece.length:
                    n = os.preadv(fd, [view[:min(WRITE_BLOCK, piece.length - done)]],
                                  piece.offset + done)
                    if n == 0:
                        raise EOFError(f"{piece.name} ended at {piece.offset + done}")
                    done += n
            finally:
                os.close(fd)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, parts))
    return time.perf_counter() - start


def all_transfers(arrays: list) -> dict:
    """The JAX floors over the state's arrays, and a probe of what pinned
    staging relies on."""
    targets = _pinned_targets(arrays)
    if targets is None:
        return {"d2h_pinned": {"skipped": "the devices have no pinned_host memory"},
                "d2h_pageable": jax_d2h_pageable(arrays), "h2d": jax_h2d(arrays, None)}
    d2h_pinned, pinned = jax_d2h_pinned(arrays, targets)
    return {"d2h_pinned": d2h_pinned,
            "d2h_pageable": jax_d2h_pageable(arrays),
            "h2d": jax_h2d(arrays, pinned),
            "pinned_numpy_is_a_view": zero_copy_numpy(pinned)}
