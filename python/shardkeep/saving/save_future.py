"""What a caller holds of a save in the background: its SaveFuture, and the
callback the save queue runs at its end. A module of its own so that the
manager's bookkeeping can name them without importing the saving code."""

from __future__ import annotations

from typing import Callable

from .. import _core
from ..errors import TimeoutError

# Runs at a save's end on the save queue's thread, whatever the outcome:
# on_finished(error, created_ns), error None once committed (created_ns
# its commit record's) or the message of what ended it (created_ns None).
# It returns True when it has reported a failure itself (its owner raises
# it later), so that the queue does not log it too.
OnFinished = Callable[[str | None, int | None], bool | None]


class SaveFuture:
    """The outcome of a save whose background phase may still be running:
    a view of the save that the process's save queue owns.

    The save does not depend on this object: dropping it lets the save
    finish in the background (a failure is then logged), and interpreter
    exit waits for it (see ``shardkeep.saving.background_saves``).
    """

    def __init__(self, save: _core.QueuedSave):
        self._save = save

    def result(self, timeout: float | None = None) -> None:
        """Waits until the checkpoint is committed.

        Raises the save's error if it failed, and shardkeep.TimeoutError if
        it is not committed within ``timeout`` seconds (None waits; the core
        bounds every wait by Options.timeout_s). Ctrl-C (KeyboardInterrupt,
        or any exception a signal handler raises) interrupts the wait within
        half a second and cancels the save: it will not commit. If its
        commit was already under way, the interrupt propagates once that
        has finished, with a note saying whether it committed.
        """
        if not self._save.result(timeout):
            raise TimeoutError(
                f"save to {self.path!r} not committed within {timeout} s; it continues in the"
                " background, call result() again to keep waiting")

    def done(self) -> bool:
        """True once the save has committed or failed."""
        return self._save.done()

    def wait_for_end(self, timeout: float | None = None) -> bool:
        """Waits until the save has committed or failed, at most ``timeout``
        seconds (None: no limit); True once it has. Unlike ``result`` it
        neither raises the save's error (for an owner whose ``on_finished``
        reported it) nor cancels the save when Ctrl-C interrupts the wait.
        """
        return self._save.wait(timeout)

    def created_ns(self) -> int | None:
        """The checkpoint's ``created_ns`` (its commit record's) once the
        save has committed; None before, or if it failed."""
        return self._save.committed_created_ns

    @property
    def path(self) -> str:
        """The checkpoint path being written."""
        return self._save.path
