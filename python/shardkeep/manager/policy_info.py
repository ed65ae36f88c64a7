"""What the manager's policies see of a checkpoint: its step, metrics and time.

The names follow Orbax's ``PolicyCheckpointInfo`` so that a policy written
for Orbax reads these unchanged. ``time`` is when the save started:

* for preservation policies, the commit record's ``created_ns`` (the
  primary process's clock), which every process reads alike and which
  survives restarts, unlike the file system's times;
* for save decisions (made on the primary), the manager's ``clock`` when
  it started the save, for the steps it saved itself: the clock "now" is
  read from (the same clock unless a test injects another).
"""

from __future__ import annotations

import dataclasses
import datetime


@dataclasses.dataclass(frozen=True)
class PolicyCheckpointInfo:
    """One checkpoint as the save-decision and preservation policies see it."""

    step: int
    metrics: dict | None  # None: saved without metrics
    time: datetime.datetime  # timezone-aware (UTC)

    def __post_init__(self):
        # A step saved without metrics is stored with {}: policies see None,
        # as Orbax gives them (its BestN asks get_metric_fn of every
        # checkpoint whose metrics are not None).
        if not self.metrics:
            object.__setattr__(self, "metrics", None)


def time_of_ns(ns: int) -> datetime.datetime:
    """Nanoseconds since the Unix epoch as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


def time_of_seconds(seconds: float) -> datetime.datetime:
    """Seconds since the Unix epoch (``time.time()``) as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
