"""Copying into host buffers on several native threads.

Memory bandwidth, and on virtual machines the first touches of fresh
memory (docs/DESIGN_NOTES.md, "Host memory"), scale with cores, so large
batches of copies (a load's received pieces, the staging pool's first
touch) are spread over native threads that never take the GIL
(``_core.BackgroundCopy``, as async saves stage).
"""

from __future__ import annotations

import os

import numpy as np

from .. import _core
from . import dtypes
from .host_memory import HUGE_PAGE_BYTES

# Below this, handing work to other threads costs more than it saves.
_PARALLEL_COPY_BYTES = 16 << 20
_MAX_COPY_THREADS = 8


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
    dtype, C-contiguous); large batches on ``copy_thread_count`` native
    threads."""
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
