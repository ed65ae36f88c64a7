"""What the end of a manager's save does: the commit bookkeeping.

The manager has no thread of its own. Each save it starts is owned by the
process's save queue (``shardkeep.saving.background_saves``), whose
finisher thread runs the save's ``on_finished`` at its end, before any
wait sees the end. For the manager that is ``Bookkeeping``'s callback:

- committed: the step goes into the record (``StepRecord.add``), the
  preservation policy runs, and the dropped steps are deleted
  (``Deletions``, primary only), there and then;
- failed: the error is kept for the next ``save``, ``wait`` or ``close``
  (``BackgroundErrors``) and what the save may have left is noted for
  removal; the callback tells the queue it reported the failure, so the
  queue does not log it as uncollected too;
- either way, the step the save took its unchanged arrays from (its
  base) is let go, and deleted if retention dropped it meanwhile.

So when a wait on the save's future returns (``wait_for_end``), its
bookkeeping and deletions are done. A local-tier slice's end is recorded
alike, by ``LocalTier.on_end``.

Nothing raised here may escape: on the queue's thread it would be lost.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time

from ..errors import TimeoutError
from ..saving.save_future import OnFinished, SaveFuture
from . import leftovers, preservation
from .background_errors import BackgroundErrors
from .deletions import Deletions
from .step_record import StepRecord

logger = logging.getLogger("shardkeep")

# Slack on top of Options.timeout_s, which already bounds every wait of a save.
_WAIT_SLACK_S = 60.0


@dataclasses.dataclass
class Commit:
    """A started save of ``<root>/<name>``, until its end."""

    step: int
    name: str
    metrics: dict
    started: float                    # time.monotonic()
    started_time: datetime.datetime   # the manager's clock
    base: int | None  # the step it takes unchanged arrays from, held until it ends
    future: SaveFuture | None = None  # set once the save is queued


class InFlight:
    """The manager's saves whose end is not yet waited for: at most one of
    the root, and the slices of one local step. Waits are on the save
    queue (``SaveFuture.wait_for_end``): once one returns, the save's
    bookkeeping is done; its error is raised by ``BackgroundErrors``."""

    def __init__(self, timeout_s: float, errors: BackgroundErrors):
        self.commit: Commit | None = None
        self.local: list = []  # of local_tier.LocalSave
        self._timeout_s = timeout_s
        self._errors = errors

    def saving(self) -> bool:
        """A save of the root has started and its end is not yet recorded."""
        return self.commit is not None and not _queued(self.commit.future).done()

    def saving_local(self) -> bool:
        return any(not _queued(job.future).done() for job in self.local)

    def wait_commit(self) -> None:
        """Waits for the save of the root in flight; raises the errors kept."""
        commit = self.commit
        if commit is not None:
            self._wait(commit.future, f"step {commit.step}")
            self.commit = None
        self._errors.raise_first()

    def wait_local(self) -> None:
        """Waits for the local saves in flight; raises the errors kept."""
        while self.local:
            job = self.local[0]
            self._wait(job.future, f"local step {job.step}")
            self.local.pop(0)
        self._errors.raise_first()

    def _wait(self, future: SaveFuture | None, what: str) -> None:
        # At most the save's own timeout, which bounds its every wait, and a slack.
        limit = self._timeout_s + _WAIT_SLACK_S
        if not _queued(future).wait_for_end(limit):
            raise TimeoutError(f"{what} was not committed within {limit:.0f} s;"
                               " it continues in the background")


def _queued(future: SaveFuture | None) -> SaveFuture:
    """The future of a save in flight: set before the save is put in flight."""
    assert future is not None, "a save is in flight before its start returned"
    return future


class Bookkeeping:
    """The callbacks that record the ends of a manager's saves."""

    def __init__(self, root: str, record: StepRecord,
                 policy: preservation.PreservationPolicy, deletions: Deletions,
                 errors: BackgroundErrors):
        self._root = root
        self._record = record
        self._policy = policy
        self._deletions = deletions
        self._errors = errors

    def release(self, step: int) -> None:
        """Lets go of a hold on ``step``, deleting it if retention dropped it meanwhile."""
        dropped = self._record.release(step)
        if dropped is not None:
            self._deletions.delete([dropped])

    def on_end(self, commit: Commit) -> OnFinished:
        """The ``on_finished`` of ``commit``'s save."""

        def finished(error: str | None, created_ns: int | None) -> bool:
            try:
                if error is None:
                    self._committed(commit, created_ns or 0)
                else:
                    self._failed(commit, error)
            except Exception as e:  # noqa: BLE001 - raised on the next call
                self._errors.record(f"recording the end of step {commit.step}'s save failed", e)
            return error is not None
        return finished

    def _committed(self, commit: Commit, created_ns: int) -> None:
        logger.info("step %d committed, %.2f s after its save started", commit.step,
                    time.monotonic() - commit.started)
        dropped, refused = self._record.add(commit.step, commit.name, commit.metrics,
                                            created_ns, commit.started_time, self._policy)
        if refused is not None:
            self._errors.record(f"the preservation policy failed once step {commit.step} had"
                                " committed; no step was deleted", refused)
        if commit.base is not None:
            self.release(commit.base)
        self._deletions.delete(dropped)

    def _failed(self, commit: Commit, error: str) -> None:
        path = leftovers.join(self._root, commit.name)
        self._errors.failed_save(f"saving step {commit.step} to {path!r} failed", error,
                                 lambda: commit.future)
        self._deletions.note_failed_save(commit.name)
        if commit.base is not None:
            self.release(commit.base)
