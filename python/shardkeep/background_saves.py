"""Saves whose background phase is still running, owned by the process.

``save_async`` hands every save it starts to this registry, which keeps it
(and the host buffers the save borrows) until the background phase ends,
whether or not the caller keeps the SaveFuture. So a bare
``sk.save_async(...)`` statement returns after the blocking phase like any
other, instead of waiting in the handle's destructor.

The core's part of the blocking phase (handing the shards over, preparing
the temporary folder, in a job the first barrier) runs on a starter
thread, in call order: training waits only for the staging copies. An
error it raises (e.g. AlreadyExistsError) is the save's outcome.

One watcher thread (started with the first save, kept for the next) notices
each save's end: it runs the save's ``on_finished`` callback (which
returns its staging memory), and logs a failure that no
``SaveFuture.result()`` call has reported (logger "shardkeep", naming the
path). At interpreter exit the registry waits for the saves
still running, at most the largest of their ``Options.timeout_s``: a save
that is still running then is abandoned and logged (if the process ends before
it commits, its temporary folder (on object stores, its generation folder)
is never read, and the next save to its path, or its next commit there,
removes it). Saves whose wait
was interrupted (KeyboardInterrupt) are cancelled and cannot commit, so
exit does not wait for them.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
from typing import Callable

from . import _core
from .errors import ShardkeepError

logger = logging.getLogger("shardkeep")

_lock = threading.Lock()
_running: set["BackgroundSave"] = set()
_exit_hook_registered = False
_watcher: threading.Thread | None = None
_starter: threading.Thread | None = None
_starts: "queue.Queue[BackgroundSave]" = queue.Queue()
_saves_started = threading.Event()  # set while saves may be running
_POLL_S = 0.02
# How much lower async saves' background threads run (see _lower_priority);
# 0 keeps the caller's priority.
BACKGROUND_NICE = 10


class BackgroundSave:
    """One save in flight: its start, the core's handle once started, its
    path and what to run at its end."""

    def __init__(self, path: str, timeout_s: float, start: Callable | None = None,
                 on_finished: Callable[[], None] | None = None):
        self.path = path
        self.timeout_s = timeout_s
        self.handle: _core.SaveHandle | None = None
        self.start_error: BaseException | None = None
        self.started = threading.Event()  # handle or start_error is set
        self.finished = threading.Event()  # set once the watcher has handled its end
        self._start = start
        self._on_finished = on_finished
        self._reported = False
        self._cancel_requested = False

    @property
    def interrupted(self) -> bool:
        return self._cancel_requested or (self.handle is not None and self.handle.interrupted)

    def done(self) -> bool:
        """True once the save has committed or failed (to start, too)."""
        return self.started.is_set() and (self.handle is None or self.handle.done())

    def claim_report(self) -> bool:
        """True for the first caller only: it reports the outcome."""
        with _lock:
            first, self._reported = not self._reported, True
            return first

    def cancel(self) -> None:
        """Stops the save from committing (an interrupted wait): at once if
        it has started, else the starter does not start it."""
        with _lock:
            self._cancel_requested = True
            handle = self.handle
        if handle is not None and not handle.cancel():
            logger.error("the save to %r could not be cancelled: its commit was under way"
                         " (it may have committed)", self.path)

    def _run_start(self) -> None:
        try:
            if self._cancel_requested:
                raise ShardkeepError(f"save to {self.path!r} cancelled before it started")
            assert self._start is not None  # started once
            handle = self._start()
        except BaseException as error:  # noqa: BLE001 - the save's outcome.
            self.start_error = error
        else:
            with _lock:
                self.handle, cancel = handle, self._cancel_requested
            if cancel:
                self.cancel()
        self._start = None
        self.started.set()

    def _finish(self) -> None:
        try:
            if self._on_finished is not None:
                self._on_finished()
            if self.start_error is not None:
                raise self.start_error
            assert self.handle is not None  # started, without an error
            self.handle.wait(0)
        except Exception as error:  # noqa: BLE001 - the save's own error.
            if not self.interrupted and self.claim_report():
                logger.error("background save to %r failed: %s", self.path, error)
        finally:
            with _lock:
                _running.discard(self)
            self.finished.set()


def track(handle, path: str, timeout_s: float,
          on_finished: Callable[[], None] | None = None) -> BackgroundSave:
    """Takes ownership of a started save until its background phase ends;
    ``on_finished`` runs then (on the watcher thread), whatever the outcome."""
    save = BackgroundSave(path, timeout_s, on_finished=on_finished)
    save.handle = handle
    save.started.set()
    _register(save)
    return save


def start(start: Callable, path: str, timeout_s: float,
          on_finished: Callable[[], None] | None = None) -> BackgroundSave:
    """Runs ``start`` (which returns the core's save handle) on the starter
    thread after the starts queued before it, and tracks the save."""
    global _starter
    save = BackgroundSave(path, timeout_s, start, on_finished)
    _register(save)
    with _lock:
        if _starter is None or not _starter.is_alive():
            _starter = threading.Thread(target=_run_starts, daemon=True,
                                        name="shardkeep-save-starter")
            _starter.start()
    _starts.put(save)
    return save


def wait_for_starts() -> None:
    """Returns once every save queued so far has started (or failed to)."""
    _starts.join()


def _run_starts() -> None:
    _lower_priority()
    while True:
        save = _starts.get()
        try:
            save._run_start()
        finally:
            # Not kept while idle: objects a daemon thread's frame holds at
            # interpreter exit are never freed.
            del save
            _starts.task_done()


def _lower_priority() -> None:
    """Lowers this thread's CPU priority to BACKGROUND_NICE.

    On Linux a thread inherits its creator's priority, so the core's save
    thread started from here, and the writer threads it starts, run at it
    too: where training and writing compete for cores (the CPU backend), the
    training step right after a save is slowed less and the background
    writes take longer. Elsewhere setpriority would change the whole
    process, so this is Linux only.
    """
    if sys.platform.startswith("linux") and BACKGROUND_NICE:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICE)
        except OSError as error:  # e.g. a sandbox forbidding it: keep the priority
            logger.debug("could not lower the priority of the save thread: %s", error)


def _register(save: BackgroundSave) -> None:
    global _exit_hook_registered, _watcher
    with _lock:
        _running.add(save)
        if not _exit_hook_registered:
            # Registered on first use, after jax.distributed.initialize has
            # registered its shutdown: atexit runs this first, while the
            # coordination service that saves may still need is up.
            atexit.register(wait_for_all)
            _exit_hook_registered = True
        if _watcher is None or not _watcher.is_alive():
            # One thread for the process's lifetime: starting one per save
            # would cost the blocking phase milliseconds.
            _watcher = threading.Thread(target=_watch, daemon=True,
                                        name="shardkeep-save-watcher")
            _watcher.start()
    _saves_started.set()


def _watch() -> None:
    # Polled from Python rather than waited for in C++: at interpreter
    # exit a daemon thread is stopped where it next takes the GIL, which
    # must not be inside C++ frames.
    while True:
        _saves_started.wait()
        with _lock:
            running = list(_running)
            if not running:
                _saves_started.clear()
                continue
        for save in running:
            if save.done():
                save._finish()
        del running, save
        time.sleep(_POLL_S)


def wait_for_all() -> None:
    """Waits for every running, uninterrupted save (and the logging of its
    outcome), at most the largest of their timeouts; logs the ones left."""
    with _lock:
        pending = [s for s in _running if not s.interrupted]
    if pending:
        logger.info("waiting for %d background save(s) to finish: %s", len(pending),
                    ", ".join(repr(s.path) for s in pending))
        deadline = time.monotonic() + max(s.timeout_s for s in pending)
        for save in pending:
            if not save.finished.wait(max(0.0, deadline - time.monotonic())):
                logger.error("background save to %r did not finish within %g s at"
                             " interpreter exit; abandoning it: it is committed only if it"
                             " finishes before the process ends", save.path, save.timeout_s)
    # Joining these while the interpreter shuts down could take as long as
    # their slowest wait (interrupted saves cannot commit any more).
    with _lock:
        for save in _running:
            if save.handle is not None and not save.handle.done():
                save.handle.abandon()
