"""Host buffers for checkpoint data: aligned, and backed by huge pages when large.

Loads and async-save staging fill gigabytes of freshly allocated memory.
With 4 KiB pages the kernel takes one page fault per 4 KiB on first touch,
and on virtual machines those faults, not the copy, dominate: filling a
fresh 1 GiB numpy buffer took 1.8 s on the benchmark VM, against 0.23 s for
the same buffer mapped with transparent huge pages (MADV_HUGEPAGE, which
the common ``enabled=madvise`` setting honours) and 0.1 s for the copy
alone. So large buffers are anonymous mappings advised to use huge pages;
where the kernel has none to give, they behave like any other memory.
"""

from __future__ import annotations

import concurrent.futures
import math
import mmap
import os

import numpy as np

# XLA's CPU client adopts a host buffer without copying it only when its
# address is a multiple of this; numpy's large allocations are 16 mod 64.
XLA_ALIGNMENT = 64

# Below one huge page a mapping cannot use one; numpy's allocator is cheaper.
HUGE_PAGE_BYTES = 2 << 20

_HUGEPAGE_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)

# Below this, starting threads costs more than they save.
_PARALLEL_COPY_BYTES = 64 << 20
_MAX_COPY_THREADS = 8


def empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype), 64-byte aligned so that device_put on the CPU
    backend adopts it instead of copying it, on huge pages when large.

    The memory is freed when the last array viewing it is (a mapping stays
    alive as long as a buffer export of it does).
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= HUGE_PAGE_BYTES:
        return _mapped(nbytes).view(dtype).reshape(shape)
    raw = np.empty(nbytes + XLA_ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % XLA_ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class Arena:
    """The buffers of one load: large ones from ``empty``, small ones carved,
    64-byte aligned, out of shared slabs on huge pages.

    A tree of thousands of small leaves then costs a slice per leaf instead
    of an allocation, and few page faults. A slab is freed when every array
    carved from it is: keeping one small leaf keeps its slab's other
    leaves' memory (at most ``SLAB_BYTES``) alive.
    """

    SLAB_BYTES = 8 << 20

    def __init__(self):
        self._slab: np.ndarray | None = None
        self._used = 0

    def empty(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes >= HUGE_PAGE_BYTES:
            return empty(shape, dtype)
        start = -(-self._used // XLA_ALIGNMENT) * XLA_ALIGNMENT
        if self._slab is None or start + nbytes > self._slab.size:
            self._slab, start = _mapped(self.SLAB_BYTES), 0
        self._used = start + nbytes
        return self._slab[start:start + nbytes].view(dtype).reshape(shape)


def _mapped(nbytes: int) -> np.ndarray:
    """``nbytes`` of fresh anonymous memory, page-aligned, advised to use
    huge pages."""
    mapping = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if _HUGEPAGE_ADVICE is not None:
        try:
            mapping.madvise(_HUGEPAGE_ADVICE)
        except OSError:  # kernels without transparent huge pages
            pass
    return np.frombuffer(mapping, np.uint8)[:nbytes]


def copy_of(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``arr`` in a buffer from ``empty``."""
    out = empty(arr.shape, arr.dtype)
    np.copyto(out, arr, casting="no")
    return out


def copies_of(arrays: list[np.ndarray], skip: list[bool]) -> list[np.ndarray]:
    """``copy_of`` each array, except where ``skip`` says so (kept as is).

    Large batches are copied on several threads (numpy releases the GIL
    while copying): first touches of fresh memory, which bound the copy,
    proceed in parallel on different cores (2 GiB on 2 cores: 2.1 s
    instead of 3.0 s on the benchmark VM).
    """
    todo = [i for i, a in enumerate(arrays) if not skip[i]]
    out = list(arrays)
    total = sum(arrays[i].nbytes for i in todo)
    workers = min(len(todo), os.cpu_count() or 1, _MAX_COPY_THREADS)
    if total < _PARALLEL_COPY_BYTES or workers < 2:
        for i in todo:
            out[i] = copy_of(arrays[i])
        return out
    # Largest first, dealt round-robin: the threads get near-equal shares,
    # and thousands of small arrays cost a few thread hand-overs, not one each.
    todo.sort(key=lambda i: -arrays[i].nbytes)
    groups = [todo[w::workers] for w in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers, "shardkeep-stage") as pool:
        copied = pool.map(lambda group: [copy_of(arrays[i]) for i in group], groups)
        for group, copies in zip(groups, copied):
            for i, copy in zip(group, copies):
                out[i] = copy
    return out
