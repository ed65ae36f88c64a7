"""Host memory that async saves stage into, kept from one save to the next.

``save_async`` must copy the state before it returns (the caller may then
donate its arrays), and that copy is what training waits for. Into fresh
memory it is bound by page faults, one per page on first touch, many
times slower than a copy into memory already touched (figures in
docs/DESIGN_NOTES.md). So the buffer one async save staged into is kept and lent to the next one
once the save that used it has finished writing.

At most one buffer is kept between saves (the largest returned since the
last release), so what this costs is at most one staging copy of the
state. ``release()`` (``shardkeep.release_staging_memory``, also called by
``CheckpointManager.close``) drops it, and buffers of saves still running
are then dropped when they finish; ``Options.reuse_staging_memory=False``
makes a save neither borrow nor keep one.

A buffer is lent to one save at a time: a save that starts while another
still writes from the kept buffer stages into fresh memory.

The first async save of a process has no kept buffer. ``prepare`` (the
manager calls it at its first step that does not save) makes one ready
ahead of time: allocated and touched on native threads in the background,
so that the first save's copy also runs into touched memory. A save that
starts while it is being prepared waits for it: the rest of the touching
is what the save would otherwise do itself.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import _core
from ..base import host_copy, host_memory

_lock = threading.Lock()
_kept: np.ndarray | None = None
_preparing: threading.Thread | None = None
# Bumped by release(): buffers lent before it are not kept when returned.
_generation = 0


class Lease:
    """One save's staging buffer (``_core.StagingCopies`` carves it)."""

    def __init__(self, buffer: np.ndarray, generation: int, keep: bool):
        self.buffer: np.ndarray | None = buffer  # None once given back
        self._generation = generation
        self._keep = keep

    def give_back(self) -> None:
        """Called once the save no longer reads the buffer (it finished,
        or never started)."""
        with _lock:
            self._give_back_locked()

    def _give_back_locked(self) -> None:
        global _kept
        buffer, self.buffer = self.buffer, None
        if buffer is None or not self._keep:
            return
        if self._generation == _generation and (_kept is None or _kept.size < buffer.size):
            _kept = buffer


def bytes_needed(sizes) -> int:
    """Buffer bytes for pieces of these sizes carved one after another."""
    return _core.StagingCopies.bytes_needed(list(sizes))


def prepare(nbytes: int) -> None:
    """Starts making a kept buffer of at least ``nbytes`` ready in the
    background, unless one is kept or being prepared."""
    global _preparing
    with _lock:
        if (_kept is not None and _kept.size >= nbytes) or _preparing is not None:
            return
        _preparing = threading.Thread(target=_prepare, args=(nbytes, _generation),
                                      name="shardkeep-staging-prepare", daemon=True)
        _preparing.start()


def _prepare(nbytes: int, generation: int) -> None:
    global _kept, _preparing
    buffer: np.ndarray | None
    try:
        buffer = host_memory.empty((nbytes,), np.uint8)
        host_copy.touch(buffer)
    except (MemoryError, OSError):  # the save allocates (and reports) it itself
        buffer = None
    with _lock:
        if _preparing is threading.current_thread():  # not one release() forgot
            _preparing = None
        if (buffer is not None and generation == _generation
                and (_kept is None or _kept.size < buffer.size)):
            _kept = buffer


def lease(nbytes: int, *, reuse: bool) -> Lease:
    """A buffer of at least ``nbytes``: the kept one if it is free and large
    enough (a smaller one is dropped), else fresh memory. Waits for a
    buffer being prepared."""
    global _kept
    buffer = None
    preparing = _preparing
    if reuse and preparing is not None:
        preparing.join()
    with _lock:
        generation = _generation
        if reuse and _kept is not None:
            buffer, _kept = _kept, None
    if buffer is None or buffer.size < nbytes:
        buffer = host_memory.empty((max(nbytes, 1),), np.uint8)
    return Lease(buffer, generation, keep=reuse)


def release() -> None:
    """Drops the kept buffer, and those of saves running now when they finish."""
    global _kept, _generation, _preparing
    with _lock:
        _kept = None
        _preparing = None  # one being prepared drops its buffer when done
        _generation += 1


def kept_bytes() -> int:
    """Size of the buffer kept for the next async save (0 if none)."""
    with _lock:
        return 0 if _kept is None else int(_kept.size)
