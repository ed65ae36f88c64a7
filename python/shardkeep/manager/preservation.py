"""Which committed checkpoints a CheckpointManager keeps: preservation policies.

A policy answers ``should_preserve(checkpoints, context=...)`` with one
bool per checkpoint (oldest first), as Orbax's do; the names and
parameters are Orbax's, so its users recognise them (docs/MANAGER.md
compares them). On top of any policy the manager always keeps the newest
committed step (a job can always resume from it) and defers deleting a
step in use (being loaded, or the base of a save in flight).

Time-based rules measure from the checkpoints' recorded times
(``PolicyCheckpointInfo.time``, the commit record's ``created_ns``), and "now"
is the newest checkpoint's time, not a process's clock: every process
decides alike, and a restart does not reset durations.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any, Callable, Collection, Protocol, Sequence, runtime_checkable

from ..errors import InvalidArgumentError
from .policy_info import PolicyCheckpointInfo


@dataclasses.dataclass(frozen=True)
class PreservationContext:
    """``now``: the time the newest checkpoint was saved (see the module docstring)."""

    now: datetime.datetime


@runtime_checkable
class PreservationPolicy(Protocol):
    def should_preserve(self, checkpoints: Sequence[PolicyCheckpointInfo], *,
                        context: PreservationContext) -> Sequence[bool]:
        ...


@dataclasses.dataclass(frozen=True)
class PreserveAll:
    """Keeps every checkpoint (the manager's default)."""

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        return [True] * len(checkpoints)


@dataclasses.dataclass(frozen=True)
class LatestN:
    """Keeps the ``n`` most recent checkpoints (None: all)."""

    n: int | None = None

    def __post_init__(self):
        _check_optional_count("n", self.n, minimum=1)

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        if self.n is None:
            return [True] * len(checkpoints)
        first = max(len(checkpoints) - self.n, 0)
        return [i >= first for i in range(len(checkpoints))]


@dataclasses.dataclass(frozen=True)
class EveryNSeconds:
    """Keeps the oldest checkpoint, then each one at least ``interval_secs``
    after the last one kept this way."""

    interval_secs: float

    def __post_init__(self):
        _check_duration("interval_secs", self.interval_secs)

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        interval = datetime.timedelta(seconds=self.interval_secs)
        result, last = [], None
        for info in checkpoints:
            keep = last is None or info.time - last >= interval
            if keep:
                last = info.time
            result.append(keep)
        return result


@dataclasses.dataclass(frozen=True)
class EveryNSteps:
    """Keeps the multiples of ``interval_steps``; with ``exact_interval=False``
    the oldest checkpoint and then each one at least ``interval_steps``
    after the last one kept this way. ``max_to_keep``: only the newest
    that many of those."""

    interval_steps: int
    exact_interval: bool = True
    max_to_keep: int | None = None

    def __post_init__(self):
        _check_optional_count("interval_steps", self.interval_steps, minimum=1, optional=False)
        _check_optional_count("max_to_keep", self.max_to_keep, minimum=0)

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        if self.exact_interval:
            result = [info.step % self.interval_steps == 0 for info in checkpoints]
        else:
            result, last = [], None
            for info in checkpoints:
                keep = last is None or info.step - last >= self.interval_steps
                if keep:
                    last = info.step
                result.append(keep)
        return _newest_only(result, self.max_to_keep)


@dataclasses.dataclass(frozen=True)
class EveryNStepsClosest:
    """For each multiple of ``interval_steps``, keeps the checkpoint nearest
    to it (the later one on a tie), and always the newest checkpoint.
    ``max_to_keep``: only the newest that many of those."""

    interval_steps: int
    max_to_keep: int | None = None

    def __post_init__(self):
        _check_optional_count("interval_steps", self.interval_steps, minimum=1, optional=False)
        _check_optional_count("max_to_keep", self.max_to_keep, minimum=0)

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        if not checkpoints:
            return []
        nearest: dict[int, tuple[int, int]] = {}  # multiple k -> (distance, index)
        for i, info in enumerate(checkpoints):
            # The multiple nearest to the step; a step half-way belongs to
            # the upper one, as with rounding half up.
            k = (2 * info.step + self.interval_steps) // (2 * self.interval_steps)
            distance = abs(info.step - k * self.interval_steps)
            if k not in nearest or distance <= nearest[k][0]:
                nearest[k] = (distance, i)
        result = [False] * len(checkpoints)
        for _, i in nearest.values():
            result[i] = True
        result[-1] = True
        return _newest_only(result, self.max_to_keep)


@dataclasses.dataclass(frozen=True)
class CustomSteps:
    """Keeps the checkpoints of the given steps."""

    steps: Collection[int]

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        wanted = set(self.steps)
        return [info.step in wanted for info in checkpoints]


@dataclasses.dataclass(frozen=True)
class BestN:
    """Keeps the ``n`` best checkpoints by ``get_metric_fn(metrics)`` (None:
    all). As in Orbax, checkpoints are ranked in ascending order of the
    value and the last ``n`` kept, so the highest values win;
    ``reverse=True`` keeps the lowest (a loss). Ties go to the later step.

    A checkpoint without metrics, or whose metrics ``get_metric_fn`` cannot
    read (it raises, or returns something other than a finite number), has
    no value: it is kept when ``keep_checkpoints_without_metrics`` (Orbax's
    default) and otherwise left to the other rules.
    """

    get_metric_fn: Callable[[Any], float]
    reverse: bool = False
    n: int | None = None
    keep_checkpoints_without_metrics: bool = True

    def __post_init__(self):
        if not callable(self.get_metric_fn):
            raise InvalidArgumentError("BestN needs get_metric_fn, a function of the metrics")
        _check_optional_count("n", self.n, minimum=0)

    def value(self, info: PolicyCheckpointInfo) -> float | None:
        """The checkpoint's finite metric value, or None."""
        if not info.metrics:
            return None
        try:
            value = self.get_metric_fn(info.metrics)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            return None
        return float(value)

    def ranked(self, checkpoints: Sequence[PolicyCheckpointInfo]) -> list[PolicyCheckpointInfo]:
        """The checkpoints that have a value, best first."""
        scored = [(value, info) for info in checkpoints
                  if (value := self.value(info)) is not None]
        sign = 1.0 if self.reverse else -1.0
        scored.sort(key=lambda item: (sign * item[0], -item[1].step))
        return [info for _, info in scored]

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        if self.n is None:
            return [True] * len(checkpoints)
        best = {info.step for info in self.ranked(checkpoints)[:self.n]}
        return [info.step in best or (self.keep_checkpoints_without_metrics
                                      and self.value(info) is None)
                for info in checkpoints]


@dataclasses.dataclass(frozen=True)
class LatestDuration:
    """Keeps the checkpoints saved within ``duration`` before the newest one."""

    duration: datetime.timedelta

    def __post_init__(self):
        if not isinstance(self.duration, datetime.timedelta) or self.duration.total_seconds() < 0:
            raise InvalidArgumentError(
                f"duration must be a datetime.timedelta >= 0, got {self.duration!r}")

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        return [context.now - info.time <= self.duration for info in checkpoints]


@dataclasses.dataclass(frozen=True)
class AnyPreservationPolicy:
    """Keeps what any of ``policies`` keeps."""

    policies: Sequence[PreservationPolicy]

    def __post_init__(self):
        for policy in self.policies:
            check_policy(policy)

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        result = [False] * len(checkpoints)
        for policy in self.policies:
            result = [a or b for a, b in zip(result, _answers(policy, checkpoints, context))]
        return result


def steps_to_delete(checkpoints: Sequence[PolicyCheckpointInfo],
                    policy: PreservationPolicy) -> list[int]:
    """The steps of ``checkpoints`` that ``policy`` drops, in increasing
    order; never the newest."""
    ordered = sorted(checkpoints, key=lambda info: info.step)
    if not ordered:
        return []
    context = PreservationContext(now=max(info.time for info in ordered))
    keep = _answers(policy, ordered, context)
    return [info.step for info, kept in zip(ordered[:-1], keep[:-1]) if not kept]


def first_best(policy: PreservationPolicy) -> BestN | None:
    """The first ``BestN`` in ``policy`` (searching ``AnyPreservationPolicy``)."""
    if isinstance(policy, BestN):
        return policy
    if isinstance(policy, AnyPreservationPolicy):
        for child in policy.policies:
            found = first_best(child)
            if found is not None:
                return found
    return None


def check_policy(policy) -> None:
    if not callable(getattr(policy, "should_preserve", None)):
        raise InvalidArgumentError(
            f"a preservation policy needs a should_preserve method, got {type(policy).__name__}")


def _answers(policy: PreservationPolicy, checkpoints: Sequence[PolicyCheckpointInfo],
             context: PreservationContext) -> list[bool]:
    answers = [bool(a) for a in policy.should_preserve(checkpoints, context=context)]
    if len(answers) != len(checkpoints):
        raise InvalidArgumentError(
            f"{type(policy).__name__}.should_preserve returned {len(answers)} answers for"
            f" {len(checkpoints)} checkpoints")
    return answers


def _newest_only(keep: list[bool], count: int | None) -> list[bool]:
    """``keep`` with only its newest ``count`` True values left (None: all)."""
    if count is None:
        return keep
    chosen = [i for i, k in enumerate(keep) if k]
    dropped = set(chosen[:max(len(chosen) - count, 0)])
    return [k and i not in dropped for i, k in enumerate(keep)]


def _check_optional_count(name: str, value, *, minimum: int, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = "None or " if optional else ""
        raise InvalidArgumentError(f"{name} must be {allowed}an int >= {minimum}, got {value!r}")


def _check_duration(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidArgumentError(f"{name} must be a number of seconds >= 0, got {value!r}")
