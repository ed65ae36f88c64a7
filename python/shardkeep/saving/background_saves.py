"""The process's save queue: the core's ``SaveQueue``, set up for Python.

Every save (``save`` and ``save_async`` alike) is handed to the queue,
which owns it until its end whether or not the caller keeps the
SaveFuture: it runs the core's part of the blocking phase on its starter
thread in call order, notices the end without polling, runs the save's
``on_finished`` (which returns its staging memory), and reports a failure
nobody collected through ``_log_failure`` (logger "shardkeep", naming the
path). The lifecycle is described atop cpp/src/engine/save_queue.cc.

At interpreter exit ``wait_for_all`` waits for the saves still running,
at most the largest of their ``Options.timeout_s``: a save still running
then is abandoned and logged (if the process ends before it commits, its
temporary folder (on object stores, its generation folder) is never read,
and the next save to its path, or its next commit there, removes it).
Saves whose wait was interrupted (KeyboardInterrupt) are cancelled and
cannot commit, so exit does not wait for them.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Callable

from .. import _core

logger = logging.getLogger("shardkeep")

# How much lower the thread that starts saves runs (Linux, where threads
# have their own priority); the save threads it starts, and their writers,
# inherit it. Where training and writing compete for cores (the CPU
# backend), the training step right after a save is slowed less. 0 keeps
# the caller's priority.
BACKGROUND_NICE = 10

_lock = threading.Lock()
_queue: _core.SaveQueue | None = None


def _log_failure(path: str, failure: str) -> None:
    logger.error("background save to %r failed: %s", path, failure)


def _process_queue() -> _core.SaveQueue:
    global _queue
    with _lock:
        if _queue is None:
            _queue = _core.SaveQueue(_log_failure, BACKGROUND_NICE)
            # Registered on first use, after jax.distributed.initialize has
            # registered its shutdown: atexit runs this first, while the
            # coordination service that saves may still need is up.
            atexit.register(wait_for_all)
        return _queue


def start(start: Callable, path: str, timeout_s: float,
          on_finished: Callable[[str | None, int | None], bool | None] | None = None
          ) -> _core.QueuedSave:
    """Queues a save: ``start`` (which returns ``_core.start_save``'s
    handle) runs after the starts queued before it, off the caller's
    thread; ``on_finished(error, created_ns)`` runs at the save's end,
    whatever the outcome (``error``: None once committed, else what ended
    it; ``created_ns``: the commit record's, None if it failed). It
    returns True when it has reported a failure itself: the queue does not
    log it then."""
    return _process_queue().enqueue(path, timeout_s, start, on_finished)


def running() -> int:
    """How many saves have not ended (interrupted ones winding down too)."""
    return 0 if _queue is None else len(_queue.running())


def paths_being_written() -> list[str]:
    """The paths of the saves that have not ended."""
    return [] if _queue is None else [s.path for s in _queue.running()]


def starter_thread_id() -> int:
    """The kernel's id of the thread that starts saves (0 before the first)."""
    return 0 if _queue is None else _queue.starter_thread_id


def wait_for_all() -> None:
    """Waits for every running, uninterrupted save (and the logging of its
    outcome), at most the largest of their timeouts; logs the ones left and
    leaves them to the end of the process."""
    if _queue is None:
        return
    try:
        pending = [s for s in _queue.running() if not s.interrupted]
        if pending:
            logger.info("waiting for %d background save(s) to finish: %s", len(pending),
                        ", ".join(repr(s.path) for s in pending))
            _queue.wait_for_uninterrupted(max(s.timeout_s for s in pending))
            for save in pending:
                if not save.done():
                    logger.error("background save to %r did not finish within %g s at"
                                 " interpreter exit; abandoning it: it is committed only if"
                                 " it finishes before the process ends", save.path,
                                 save.timeout_s)
    finally:
        # No Python runs on the queue's threads after this, as the
        # interpreter shuts down.
        _queue.close()
        _forget_queue()


def _forget_queue() -> None:
    """Drops the closed queue's Python object (its core queue lives on for
    saves left running): held by this module until the interpreter's end,
    nanobind would report it as leaked on every exit."""
    global _queue
    with _lock:
        _queue = None
