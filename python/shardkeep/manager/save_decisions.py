"""When a CheckpointManager saves: save-decision policies, named as Orbax names them.

A policy answers ``should_save(step, previous_steps, context=...)`` for a
step the training loop reached. ``previous_steps`` are the checkpoints
saved so far (committed, then the one in flight, oldest first), as
``PolicyCheckpointInfo``; ``step.time`` is now.

Every process of a job must save the same steps. A policy whose answer
depends only on values all processes share (the step, the saves started,
the agreed preemption step) says so with ``same_on_every_process = True``
and is asked on every process. Any other policy (a time-based one, or a
user's own without that attribute) is asked on the primary process only;
its yes is announced to the others and becomes a save a few steps later
on all of them (``shardkeep.manager.step_agreement``). In a one-process
job every policy is asked directly. docs/MANAGER.md compares these with
Orbax's.

Orbax's own policy objects work here too: the context and the step infos
carry every attribute they read, and ``split`` knows which of them decide
from the step alone.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable, ClassVar, Collection, Protocol, Sequence, runtime_checkable

from ..errors import InvalidArgumentError
from .policy_info import PolicyCheckpointInfo


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """The processes a manager runs on, with the fields of Orbax's
    ``MultiprocessingOptions`` (Orbax's policies read ``primary_host``).

    A shardkeep manager always runs on every process of the job, with
    process 0 as its primary: the one that decides for the policies asked
    on one process only, deletes and collects garbage. So ``primary_host``
    is 0, ``active_processes`` None (all of them) and
    ``barrier_sync_key_prefix`` None (the manager names its collective
    calls itself, by its root).
    """

    primary_host: int | None = 0
    active_processes: frozenset[int] | None = None
    barrier_sync_key_prefix: str | None = None


@dataclasses.dataclass(frozen=True)
class DecisionContext:
    """What the manager knows beyond the steps: the attributes of Orbax's
    ``DecisionContext``, so that Orbax's policies read it unchanged."""

    is_saving_in_progress: bool  # a save has started and not committed (or failed)
    reached_preemption: bool     # the agreed preemption step has been reached
    multiprocessing_options: MultiprocessingOptions = MultiprocessingOptions()


@runtime_checkable
class SaveDecisionPolicy(Protocol):
    """Decides whether the step the loop reached is saved."""

    def should_save(self, step: PolicyCheckpointInfo, previous_steps: Sequence[PolicyCheckpointInfo], *,
                    context: DecisionContext) -> bool:
        ...


@dataclasses.dataclass(frozen=True)
class FixedIntervalPolicy:
    """Saves every step that is a multiple of ``interval``."""

    interval: int
    same_on_every_process: ClassVar[bool] = True

    def __post_init__(self):
        check_positive("interval", self.interval)

    def should_save(self, step, previous_steps, *, context) -> bool:
        return step.step % self.interval == 0


@dataclasses.dataclass(frozen=True)
class SpecificStepsPolicy:
    """Saves the steps in ``steps``."""

    steps: Collection[int]
    same_on_every_process: ClassVar[bool] = True

    def should_save(self, step, previous_steps, *, context) -> bool:
        return step.step in self.steps


@dataclasses.dataclass(frozen=True)
class ContinuousCheckpointingPolicy:
    """Saves as soon as the previous save has committed, and no sooner than
    ``minimum_interval_secs`` after the previous save started (None: no
    minimum).

    Decided on the primary process, by its clock; the other processes save
    the step it announces (see the module docstring).
    """

    minimum_interval_secs: float | None = None
    same_on_every_process: ClassVar[bool] = False

    def __post_init__(self):
        interval = self.minimum_interval_secs
        if interval is not None and (isinstance(interval, bool)
                                     or not isinstance(interval, (int, float)) or interval < 0):
            raise InvalidArgumentError(
                f"minimum_interval_secs must be None or a number >= 0, got {interval!r}")

    def should_save(self, step, previous_steps, *, context) -> bool:
        if context.is_saving_in_progress:
            return False
        if not previous_steps or self.minimum_interval_secs is None:
            return True
        elapsed = step.time - previous_steps[-1].time
        return elapsed >= datetime.timedelta(seconds=self.minimum_interval_secs)


@dataclasses.dataclass(frozen=True)
class PreemptionCheckpointingPolicy:
    """Saves the step at which the job's processes agreed to stop."""

    same_on_every_process: ClassVar[bool] = True

    def should_save(self, step, previous_steps, *, context) -> bool:
        return context.reached_preemption


@dataclasses.dataclass(frozen=True)
class InitialSavePolicy:
    """Saves the first step reached when the root holds no checkpoint."""

    same_on_every_process: ClassVar[bool] = True

    def should_save(self, step, previous_steps, *, context) -> bool:
        return not previous_steps


@dataclasses.dataclass(frozen=True)
class AnySavePolicy:
    """Saves when any of ``policies`` says so."""

    policies: Sequence[SaveDecisionPolicy]

    def __post_init__(self):
        for policy in self.policies:
            check_policy(policy)

    def should_save(self, step, previous_steps, *, context) -> bool:
        return any(p.should_save(step, previous_steps, context=context) for p in self.policies)


class Decider:
    """``policy`` applied as every process of the job must apply it.

    The parts that are the same on every process are asked here; the
    others on the primary only, through ``agreement`` (a
    ``step_agreement.StepAgreement``, or ``Immediate`` in a one-process
    job; made only when a part needs it), which turns the primary's yes into one step for all.
    """

    def __init__(self, policy: SaveDecisionPolicy, make_agreement: Callable[[], Any]):
        check_policy(policy)
        self._everywhere, self._primary = split(policy)
        self.agreement = make_agreement() if self._primary else None

    def due(self, step: int, previous: Sequence[PolicyCheckpointInfo], context: DecisionContext,
            now: datetime.datetime) -> bool:
        info = PolicyCheckpointInfo(step, None, now)
        due = any(p.should_save(info, previous, context=context) for p in self._everywhere)
        if self.agreement is None:
            return due
        agreement = self.agreement
        # A save decided this step, or one decided and not yet made, is in progress.
        primary_context = dataclasses.replace(
            context, is_saving_in_progress=context.is_saving_in_progress or due
            or agreement.pending)
        # Asked at every step: the agreement follows the loop's steps.
        agreed = agreement.due(step, lambda: any(
            p.should_save(info, previous, context=primary_context) for p in self._primary))
        return due or agreed

    def close(self) -> None:
        if self.agreement is not None:
            self.agreement.close()


def check_policy(policy) -> None:
    if not callable(getattr(policy, "should_save", None)):
        raise InvalidArgumentError(
            f"a save decision policy needs a should_save method, got {type(policy).__name__}")


def split(policy: SaveDecisionPolicy
          ) -> tuple[list[SaveDecisionPolicy], list[SaveDecisionPolicy]]:
    """``policy``'s leaves: (asked on every process, asked on the primary only)."""
    orbax = _orbax_class(policy)
    if isinstance(policy, AnySavePolicy) or orbax == "AnySavePolicy":
        everywhere: list[SaveDecisionPolicy] = []
        primary: list[SaveDecisionPolicy] = []
        children: Sequence[SaveDecisionPolicy] = getattr(policy, "policies")  # Orbax's too
        for child in children:
            e, p = split(child)
            everywhere += e
            primary += p
        return everywhere, primary
    if getattr(policy, "same_on_every_process", False) or orbax in _ORBAX_SAME_ON_EVERY_PROCESS:
        return [policy], []
    return [], [policy]


# Orbax's own policies (orbax-checkpoint 0.12), known by the module that
# defines them so that shardkeep need not import Orbax. Those that decide
# from the step and the saves started alone, like the classes of the same
# names here, are asked on every process: asked on the primary only they
# would save ``decision_lead_steps`` later than Orbax does. Its
# AnySavePolicy is opened like ours. Any other class of Orbax's
# (ContinuousCheckpointingPolicy), a subclass, or one Orbax moves, is asked
# on the primary only, as a user's policy is: always correct, at worst later.
_ORBAX_POLICIES = "orbax.checkpoint._src.checkpoint_managers.save_decision_policy"
_ORBAX_SAME_ON_EVERY_PROCESS = frozenset({
    "FixedIntervalPolicy", "SpecificStepsPolicy", "PreemptionCheckpointingPolicy",
    "InitialSavePolicy"})


def _orbax_class(policy) -> str | None:
    """The name of ``policy``'s class when it is one of Orbax's own (not a subclass)."""
    cls = type(policy)
    return cls.__qualname__ if cls.__module__ == _ORBAX_POLICIES else None


def check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
