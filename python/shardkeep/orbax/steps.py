"""What Orbax's managers answer about steps that shardkeep's manager leaves to its ``save``.

shardkeep's manager decides inside ``save`` whether a step is due; Orbax's
v0 manager and v1 Checkpointer also answer ``should_save(step)`` and
``is_saving_in_progress()`` beforehand, and refuse to force a step that is
already saved. ``Steps`` answers them for both, from the policy given to
the manager and the saves started through it.
"""

from __future__ import annotations

import datetime
import pathlib
import time
from typing import Any

import shardkeep as sk

_EPOCH = datetime.datetime.fromtimestamp(0, tz=datetime.timezone.utc)


class Steps:
    """The saves started through ``manager`` under its save decision ``policy``."""

    def __init__(self, manager: sk.CheckpointManager, policy: Any):
        self.manager = manager
        self._policy = policy
        self._pending: int | None = None  # a save started and not yet seen committed
        self._started: dict[int, datetime.datetime] = {}

    @property
    def directory(self) -> pathlib.Path | str:
        """The root: a ``pathlib.Path``, or the URL of a root on another store."""
        root = self.manager.root
        return root if "://" in root else pathlib.Path(root)

    def saving(self) -> bool:
        """Whether a save started here has not yet been seen committed."""
        if self._pending is not None and self._pending in self.manager.all_steps():
            self._pending = None
        return self._pending is not None

    def should_save(self, step: int) -> bool:
        """Whether ``save(step)`` would save: ``step`` is after the last step
        saved and the policy says so. The policy sees the steps saved here
        with the times they started, and those found in the root timed at
        the epoch (only ``ContinuousCheckpointingPolicy`` reads them)."""
        saving = self.saving()
        last = self._pending if saving else self.manager.latest_step()
        if last is not None and step <= last:
            return False
        info = sk.save_decisions.PolicyCheckpointInfo
        previous = [info(s, self.manager.metrics(s), self._started.get(s, _EPOCH))
                    for s in self.manager.all_steps()]
        if self._pending is not None:
            previous.append(info(self._pending, None, self._started[self._pending]))
        context = sk.save_decisions.DecisionContext(
            is_saving_in_progress=saving, reached_preemption=self.manager.reached_preemption(step))
        return bool(self._policy.should_save(info(step, None, _now()), previous,
                                             context=context))

    def save(self, step: int, value: Any, *, metrics: Any, force: bool,
             custom_metadata: Any = None) -> bool:
        """The manager's save, refusing (as Orbax does) to force a step already saved."""
        if force and step in self.manager.all_steps():
            raise sk.InvalidArgumentError(
                f"step {step} is already saved under {self.manager.root!r}: a step is never"
                f" saved twice")
        started_at = _now()
        saved = self.manager.save(step, value, metrics=metrics, force=force,
                                  custom_metadata=custom_metadata)
        if saved:
            self._pending = step
            self._started[step] = started_at
        return saved

    def wait(self) -> None:
        self.manager.wait()
        self._pending = None

    def close(self) -> None:
        self.manager.close()
        self._pending = None


def _now() -> datetime.datetime:
    return datetime.datetime.fromtimestamp(time.time(), tz=datetime.timezone.utc)
