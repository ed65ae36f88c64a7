"""Host buffers for checkpoint data: aligned, and backed by huge pages when large.

Loads and async-save staging fill gigabytes of freshly allocated memory.
With 4 KiB pages the kernel takes one page fault per 4 KiB on first touch,
and on virtual machines those faults, not the copy, dominate (figures in
docs/DESIGN_NOTES.md, "Host memory"); transparent huge pages
(MADV_HUGEPAGE, which the common ``enabled=madvise`` setting honours) cut
them by the page size. So large buffers are anonymous mappings advised to
use huge pages; where the kernel has none to give, they behave like any
other memory.
"""

from __future__ import annotations

import math
import mmap
import os

import numpy as np

from .. import _core
from . import dtypes

# XLA's CPU client adopts a host buffer without copying it only when its
# address is a multiple of this; numpy's large allocations are 16 mod 64.
XLA_ALIGNMENT = 64

# Below one huge page a mapping cannot use one; numpy's allocator is cheaper.
HUGE_PAGE_BYTES = 2 << 20

_HUGEPAGE_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)

# Below this, handing work to other threads costs more than it saves.
_PARALLEL_COPY_BYTES = 16 << 20
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


def touch(buffer: np.ndarray) -> None:
    """Writes every page of ``buffer`` (uint8) once, so that later copies
    into it run at memory speed: on virtual machines the first touch of
    memory the process has not used recently is what costs
    (docs/DESIGN_NOTES.md, "Host memory")."""
    zeros = np.zeros(HUGE_PAGE_BYTES, np.uint8)
    pieces = [buffer[start:start + zeros.size] for start in range(0, buffer.size, zeros.size)]
    copy_all([zeros[:piece.size] for piece in pieces], pieces)


def copy_thread_count() -> int:
    """How many threads copy a large batch: memory bandwidth, and first
    touches of fresh memory, scale with cores."""
    return min(os.cpu_count() or 1, _MAX_COPY_THREADS)


def copy_all(sources: list[np.ndarray], destinations: list[np.ndarray]) -> None:
    """Copies each source into the destination beside it (same shape and
    dtype, C-contiguous).

    Large batches are copied on native threads that never take the GIL
    (``_core.BackgroundCopy``, as async saves stage): memory bandwidth, and
    first touches of fresh memory, scale with cores.
    """
    total = sum(src.nbytes for src in sources)
    if total < _PARALLEL_COPY_BYTES or copy_thread_count() < 2:
        for src, dst in zip(sources, destinations):
            np.copyto(dst, src)
        return
    # About two batches a thread: near-equal shares, few hand-overs.
    threads = copy_thread_count()
    copy = _core.BackgroundCopy(threads, max(1 << 20, total // (2 * threads)))
    for src, dst in zip(sources, destinations):
        if src.shape != dst.shape or src.dtype != dst.dtype:
            raise ValueError(f"copy_all: {src.dtype}{list(src.shape)} into"
                             f" {dst.dtype}{list(dst.shape)}")  # a bug, not input
        copy.add(dtypes.as_bytes(src), dtypes.as_bytes(dst))
    copy.finish()
