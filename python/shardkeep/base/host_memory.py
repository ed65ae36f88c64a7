"""Host buffers for checkpoint data: aligned, and backed by huge pages when large.

Loads and async-save staging fill gigabytes of freshly allocated memory.
With 4 KiB pages the kernel takes one page fault per 4 KiB on first touch,
and on virtual machines those faults, not the copy, dominate (figures in
docs/DESIGN_NOTES.md, "Host memory"); transparent huge pages
(MADV_HUGEPAGE, which the common ``enabled=madvise`` setting honours) cut
them by the page size. So large buffers are anonymous mappings advised to
use huge pages; where the kernel has none to give, they behave like any
other memory. Filling them fast is ``host_copy``'s.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from .. import _core

# XLA's CPU client adopts a host buffer without copying it only when its
# address is a multiple of this (the core's rule, which also aligns every
# chunk in a data file); numpy's large allocations are 16 mod 64.
XLA_ALIGNMENT: int = _core.XLA_ALIGNMENT

# Below one huge page a mapping cannot use one; numpy's allocator is cheaper.
HUGE_PAGE_BYTES = 2 << 20

_HUGEPAGE_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)


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
