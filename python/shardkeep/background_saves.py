"""Saves whose background phase is still running, owned by the process.

``save_async`` hands the core's handle of every save it starts to this
registry, which keeps it (and the host buffers the save borrows) until the
background phase ends, whether or not the caller keeps the SaveFuture. So
a bare ``sk.save_async(...)`` statement returns after the blocking phase
like any other, instead of waiting in the handle's destructor.

For each save a watcher thread waits for its outcome; a failure that no
``SaveFuture.result()`` call has reported is logged (logger "shardkeep",
naming the path). At interpreter exit the registry waits for the saves
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
import threading
import time

logger = logging.getLogger("shardkeep")

_lock = threading.Lock()
_running: set["BackgroundSave"] = set()
_exit_hook_registered = False


class BackgroundSave:
    """One save in flight: the core's handle, its path and its watcher."""

    def __init__(self, handle, path: str, timeout_s: float):
        self.handle = handle
        self.path = path
        self.timeout_s = timeout_s
        self._reported = False
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name=f"shardkeep-save-watcher {path}")

    def claim_report(self) -> bool:
        """True for the first caller only: it reports the outcome."""
        with _lock:
            first, self._reported = not self._reported, True
            return first

    def _watch(self) -> None:
        # Polled from Python rather than waited for in C++: at interpreter
        # exit a daemon thread is stopped where it next takes the GIL, which
        # must not be inside C++ frames.
        while not self.handle.done():
            time.sleep(0.05)
        try:
            self.handle.wait(0)
        except Exception as error:  # noqa: BLE001 - the save's own error.
            if not self.handle.interrupted and self.claim_report():
                logger.error("background save to %r failed: %s", self.path, error)
        finally:
            with _lock:
                _running.discard(self)


def track(handle, path: str, timeout_s: float) -> BackgroundSave:
    """Takes ownership of a started save until its background phase ends."""
    global _exit_hook_registered
    save = BackgroundSave(handle, path, timeout_s)
    with _lock:
        _running.add(save)
        if not _exit_hook_registered:
            # Registered on first use, after jax.distributed.initialize has
            # registered its shutdown: atexit runs this first, while the
            # coordination service that saves may still need is up.
            atexit.register(wait_for_all)
            _exit_hook_registered = True
    save._watcher.start()
    return save


def wait_for_all() -> None:
    """Waits for every running, uninterrupted save (and the logging of its
    outcome), at most the largest of their timeouts; logs the ones left."""
    with _lock:
        pending = [s for s in _running if not s.handle.interrupted]
    if pending:
        logger.info("waiting for %d background save(s) to finish: %s", len(pending),
                    ", ".join(repr(s.path) for s in pending))
        deadline = time.monotonic() + max(s.timeout_s for s in pending)
        for save in pending:
            save._watcher.join(max(0.0, deadline - time.monotonic()))
            if save._watcher.is_alive():
                logger.error("background save to %r did not finish within %g s at"
                             " interpreter exit; abandoning it: it is committed only if it"
                             " finishes before the process ends", save.path, save.timeout_s)
    # Joining these while the interpreter shuts down could take as long as
    # their slowest wait (interrupted saves cannot commit any more).
    with _lock:
        for save in _running:
            if not save.handle.done():
                save.handle.abandon()
