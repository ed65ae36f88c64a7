"""The manager's record of steps: what is committed, its metrics and times.

The root is listed once, when the manager is created
(``shardkeep.manager.step_listing``); from then on this record is what
was found plus what was committed, and every decision (save or skip, what
retention drops) is a function of it and of values identical on all
processes, so all processes decide alike.

Orbax steps found under the root (``shardkeep.manager.orbax_steps``)
are committed steps to list, load and time save decisions by, but not
retention's to delete nor the base a save takes unchanged arrays from.

The training thread reads it; the save queue's thread adds each commit
(``shardkeep.manager.commits``). One lock guards it all.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import math
import threading
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from ..errors import InvalidArgumentError, NotFoundError
from . import local_slices, policy_info, preservation

# The prefix of the custom-metadata keys shardkeep's own records use.
RESERVED_PREFIX = "shardkeep_"


class Listed(NamedTuple):
    """A committed step as the root's listing found it."""

    name: str  # its folder under the root
    metrics: dict
    created_ns: int
    orbax: bool  # an Orbax step folder, not shardkeep's


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A step retention dropped (or a deferred one let go) whose folder is to be deleted."""

    step: int
    name: str


class StepRecord:
    """Committed steps: their folder names, metrics, record times and, for the
    steps this manager saved, their start by the manager's clock; and the
    steps held from deletion (being loaded, or the base of a save)."""

    def __init__(self, root: str, found: dict[int, Listed]):
        """``found``: the listing's committed steps under ``root``."""
        self._root = root
        self._lock = threading.Lock()
        self._steps = {step: listed.metrics for step, listed in found.items()}
        self._created_ns = {step: listed.created_ns for step, listed in found.items()}
        self._names = {step: listed.name for step, listed in found.items()}
        self._orbax = frozenset(step for step, listed in found.items() if listed.orbax)
        # Step saved by this manager -> its start by ``clock`` (save decisions).
        self._started_times: dict[int, datetime.datetime] = {}
        self._version = 0  # counts the changes of the record above
        self._previous_cache: tuple[int, Any, list] | None = None  # see previous
        self._in_use: collections.Counter = collections.Counter()
        self._deferred: dict[int, str] = {}  # dropped while in use: step -> name

    # -- queries ---------------------------------------------------------

    def steps(self) -> list[int]:
        with self._lock:
            return sorted(self._steps)

    def latest(self) -> int | None:
        with self._lock:
            return max(self._steps, default=None)

    def orbax_steps(self) -> list[int]:
        """The committed steps that are Orbax step folders."""
        with self._lock:
            return sorted(self._orbax.intersection(self._steps))

    def is_orbax(self, step: int) -> bool:
        return step in self._orbax

    def metrics(self, step: int) -> dict:
        """A copy of ``step``'s metrics; NotFoundError when it is not committed."""
        with self._lock:
            metrics = self._steps.get(step)
        if metrics is None:
            raise NotFoundError(self._not_committed(step))
        return dict(metrics)

    def name(self, step: int) -> str | None:
        with self._lock:
            return self._names.get(step)

    def ranked_first(self, best: preservation.BestN) -> int | None:
        """The step ``best`` ranks first, or None."""
        with self._lock:
            ranked = best.ranked(self._committed())
        return ranked[0].step if ranked else None

    def previous(self, pending: Any) -> list[policy_info.PolicyCheckpointInfo]:
        """The steps saved so far as the save decisions see them: committed,
        then ``pending`` (the save in flight: step, metrics, started_time;
        or None). The steps this manager saved are timed by its ``clock``
        (the clock "now" is read from), the others by their records.

        Asked at every training step: the list is rebuilt only when the
        record or the save in flight has changed since the last call.
        """
        with self._lock:
            cache = self._previous_cache
            # The save in flight by identity (the cache holds it: no reused id).
            if cache is not None and cache[0] == self._version and cache[1] is pending:
                return cache[2]
            previous = [dataclasses.replace(info, time=self._started_times.get(info.step,
                                                                               info.time))
                        for info in self._committed()]
            if pending is not None and pending.step not in self._steps:
                previous.append(policy_info.PolicyCheckpointInfo(pending.step, pending.metrics,
                                                                 pending.started_time))
            self._previous_cache = (self._version, pending, previous)
        return previous

    # -- changes ---------------------------------------------------------

    def add(self, step: int, name: str, metrics: dict, created_ns: int,
            started_time: datetime.datetime, policy: preservation.PreservationPolicy
            ) -> tuple[list[Dropped], BaseException | None]:
        """Records a commit, then applies ``policy``: returns the dropped
        steps to delete now (those in use are deleted when let go), and
        the policy's error, if it failed (then nothing is dropped)."""
        with self._lock:
            self._version += 1  # also covers the drops below
            self._steps[step] = metrics
            self._created_ns[step] = created_ns
            self._started_times[step] = started_time
            self._names[step] = name
            try:
                dropped = preservation.steps_to_delete(
                    [info for info in self._committed() if info.step not in self._orbax], policy)
            except Exception as e:  # noqa: BLE001 - the policy's: raised on the next call
                return [], e
            deletions = []
            for old in dropped:
                del self._steps[old]
                del self._created_ns[old]
                self._started_times.pop(old, None)
                old_name = self._names.pop(old)
                if self._in_use[old]:
                    self._deferred[old] = old_name
                else:
                    deletions.append(Dropped(old, old_name))
            return deletions, None

    def hold_latest(self) -> tuple[int, str] | None:
        """Holds the latest committed shardkeep step from deletion (the base
        of a save) until ``release``; (step, name), or None without one."""
        with self._lock:
            base = max((s for s in self._steps if s not in self._orbax), default=None)
            if base is None:
                return None
            self._in_use[base] += 1
            return base, self._names[base]

    def hold(self, step: int | None) -> tuple[int, str]:
        """Holds committed ``step`` (None: the latest) from deletion (a load)
        until ``release``; (step, name). NotFoundError when there is no such step."""
        with self._lock:
            wanted = max(self._steps, default=None) if step is None else step
            if wanted is not None and wanted in self._steps:
                self._in_use[wanted] += 1
                return wanted, self._names[wanted]
        raise NotFoundError(f"no committed checkpoint under {self._root!r}" if step is None
                            else self._not_committed(step))

    def release(self, step: int) -> Dropped | None:
        """Lets go of a hold; returns the step to delete when retention
        dropped it meanwhile and this was its last hold."""
        with self._lock:
            self._in_use[step] -= 1
            if self._in_use[step]:
                return None
            del self._in_use[step]
            name = self._deferred.pop(step, None)
        return None if name is None else Dropped(step, name)

    def _not_committed(self, step: int) -> str:
        orbax = self.orbax_steps()
        return (f"step {step} is not a committed checkpoint under {self._root!r};"
                f" committed steps: {self.steps()}" + (f" (Orbax steps: {orbax})" if orbax else ""))

    def _committed(self) -> list[policy_info.PolicyCheckpointInfo]:
        """The committed steps as the policies see them, oldest first (holding the lock)."""
        return [policy_info.PolicyCheckpointInfo(step, self._steps[step],
                                                 policy_info.time_of_ns(self._created_ns[step]))
                for step in sorted(self._steps)]


def plain_metrics(metrics: Mapping | None) -> dict:
    """``metrics`` as the JSON object it is stored as.

    NumPy and JAX scalars become numbers; NaN and infinities become None
    (JSON has no such numbers), so such a step is never the best.
    """
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise InvalidArgumentError(f"metrics must be a mapping, got {type(metrics).__name__}")

    def plain(value):
        if isinstance(value, (np.generic, np.ndarray, jax.Array)) and np.size(value) == 1:
            value = np.asarray(value).item()
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    try:
        return json.loads(json.dumps({k: plain(v) for k, v in metrics.items()},
                                     allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"metrics are not JSON-serialisable: {e}") from e


def checked_custom_metadata(custom_metadata: Mapping | None) -> Mapping | None:
    """A save's ``custom_metadata``, refused when a key starts with
    "shardkeep_": those mark shardkeep's own records (the local tier's
    slices carry ``local_slices.LOCAL_MARK``), and a user's key must never
    make a step read as one of them, nor be taken for theirs."""
    if custom_metadata is None:
        return None
    if not isinstance(custom_metadata, Mapping):
        raise InvalidArgumentError(
            f"custom_metadata must be a mapping, got {type(custom_metadata).__name__}")
    reserved = sorted(str(k) for k in custom_metadata if str(k).startswith(RESERVED_PREFIX))
    if reserved:
        raise InvalidArgumentError(
            f"custom_metadata keys {reserved} are reserved: keys starting with"
            f" {RESERVED_PREFIX!r} mark shardkeep's own records (such as"
            f" {local_slices.LOCAL_MARK!r}); rename them")
    return custom_metadata


def checked_step(step) -> int:
    """``step`` as an int; InvalidArgumentError unless a non-negative integer."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise InvalidArgumentError(f"step must be a non-negative int, got {step!r}")
    return int(step)
