"""``shardkeep.orbax.v1.training``: Orbax v1's training ``Checkpointer`` over shardkeep's manager.

The calls, argument names and defaults are those of
``orbax.checkpoint.experimental.v1.training.Checkpointer`` (orbax-checkpoint
0.12): by default it saves the first step, then each step once the
previous save has committed, and at a preemption; it keeps every step.
A pytree is saved as the checkpointable ``checkpointable_name`` ("state",
shardkeep's name for one tree too), ``save_checkpointables``' dict as
named checkpointables. ``save_decision_policies`` and
``preservation_policies`` are shardkeep's policy namespaces, with Orbax's
names. Unsupported arguments are refused by name (docs/ORBAX.md).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import shardkeep as sk

from ..refusals import Unsupported, check
from ..steps import Steps

save_decision_policies = sk.save_decisions
preservation_policies = sk.preservation

_STATE = "state"


@dataclasses.dataclass(frozen=True)
class CheckpointMetadata:
    """A committed step as ``Checkpointer.checkpoints`` lists it: Orbax's
    fields, with the timestamps None (the manager lists steps without
    reading their records' times)."""

    step: int
    path: pathlib.Path | str
    metadata: Any = None
    metrics: Any = None
    custom_metadata: Any = None
    init_timestamp_nsecs: int | None = None
    commit_timestamp_nsecs: int | None = None


class AsyncResponse:
    """The save in flight of a ``save_async``: ``result()`` waits for its
    commit and returns True (or raises the save's error)."""

    def __init__(self, checkpointer: Checkpointer):
        self._checkpointer = checkpointer

    def result(self, timeout: float | None = None) -> bool:
        check("AsyncResponse.result", {"timeout": Unsupported(
            timeout, None, "the manager's Options.timeout_s bounds every wait")})
        self._checkpointer.wait()
        return True


class Checkpointer:
    """Saves a training run's steps under ``directory``, as Orbax v1's training Checkpointer.

    ``context``, ``step_name_format``, ``custom_metadata`` and ``logger``
    are refused; ``cleanup_tmp_directories`` is accepted either way
    (shardkeep always removes what its failed saves left).
    """

    def __init__(self, directory: Any, *, context: Any = None,
                 save_decision_policy: Any = None, preservation_policy: Any = None,
                 step_name_format: Any = None, custom_metadata: Any = None,
                 cleanup_tmp_directories: bool = False, lightweight_initialize: bool = False,
                 logger: Any = None):
        check("Checkpointer", {
            "context": Unsupported(context, None, "give shardkeep's settings as"
                                   " shardkeep.Options through a shardkeep.CheckpointManager"),
            "step_name_format": Unsupported(step_name_format, None,
                                            "step folders are named by the step alone"),
            "custom_metadata": Unsupported(custom_metadata, None, "shardkeep keeps no root"
                                           " metadata; give it to each step's save"
                                           " (custom_metadata=)"),
            "lightweight_initialize": Unsupported(
                lightweight_initialize, False, "the manager reads every step's commit record"
                " once, when it is created"),
            "logger": Unsupported(logger, None, "shardkeep reports to the 'shardkeep' Python"
                                  " logger and to jax.monitoring"),
        })
        if save_decision_policy is None:
            save_decision_policy = sk.save_decisions.AnySavePolicy([
                sk.save_decisions.InitialSavePolicy(),
                sk.save_decisions.ContinuousCheckpointingPolicy(),
                sk.save_decisions.PreemptionCheckpointingPolicy()])
        self._manager = sk.CheckpointManager(
            os.fspath(directory), save_decision_policy=save_decision_policy,
            preservation_policy=preservation_policy or sk.preservation.PreserveAll(),
            async_save=True, step_width=1)
        self._steps = Steps(self._manager, save_decision_policy)

    # -- steps -----------------------------------------------------------

    @property
    def directory(self) -> pathlib.Path | str:
        """The root: a ``pathlib.Path``, or the URL of a root on another store."""
        return self._steps.directory

    @property
    def checkpoints(self) -> list[CheckpointMetadata]:
        """The committed steps, in increasing order."""
        return [CheckpointMetadata(step, self._manager.step_path(step),
                                   metrics=self._manager.metrics(step) or None)
                for step in self._manager.all_steps()]

    @property
    def latest(self) -> CheckpointMetadata | None:
        checkpoints = self.checkpoints
        return checkpoints[-1] if checkpoints else None

    def metadata(self, step: Any = None) -> CheckpointMetadata:
        """Step ``step`` (a step, a ``CheckpointMetadata`` or None: the
        latest) with its metrics and custom metadata. Its ``metadata`` (in
        Orbax, the tree's) is None: ``shardkeep.metadata`` describes trees."""
        if isinstance(step, CheckpointMetadata):
            step = step.step
        if step is None:
            step = self._manager.latest_step()
            if step is None:
                raise sk.NotFoundError(f"no committed checkpoint under {self._manager.root!r}")
        return CheckpointMetadata(step, self._manager.step_path(step),
                                  metrics=self._manager.metrics(step) or None,
                                  custom_metadata=self._manager.custom_metadata(step))

    def should_save(self, step: int) -> bool:
        """Whether ``save(step)`` would save (``shardkeep.orbax.steps``)."""
        return self._steps.should_save(step)

    # -- save ------------------------------------------------------------

    def save(self, step: int, state: Any, *, checkpointable_name: str = _STATE,
             force: bool = False, overwrite: bool = False, metrics: Any = None,
             custom_metadata: Any = None) -> bool:
        """Saves ``state`` at ``step`` if the policy says so (or ``force``),
        and waits for its commit; returns whether it saved."""
        response = self.save_async(step, state, checkpointable_name=checkpointable_name,
                                   force=force, overwrite=overwrite, metrics=metrics,
                                   custom_metadata=custom_metadata)
        return False if response is None else response.result()

    def save_async(self, step: int, state: Any, *, checkpointable_name: str = _STATE,
                   force: bool = False, overwrite: bool = False, metrics: Any = None,
                   custom_metadata: Any = None) -> AsyncResponse | None:
        return self.save_checkpointables_async(step, {checkpointable_name: state}, force=force,
                                               overwrite=overwrite, metrics=metrics,
                                               custom_metadata=custom_metadata)

    def save_checkpointables(self, step: int, checkpointables: dict[str, Any], *,
                             force: bool = False, overwrite: bool = False, metrics: Any = None,
                             custom_metadata: Any = None) -> bool:
        response = self.save_checkpointables_async(
            step, checkpointables, force=force, overwrite=overwrite, metrics=metrics,
            custom_metadata=custom_metadata)
        return False if response is None else response.result()

    def save_checkpointables_async(self, step: int, checkpointables: dict[str, Any], *,
                                   force: bool = False, overwrite: bool = False,
                                   metrics: Any = None, custom_metadata: Any = None
                                   ) -> AsyncResponse | None:
        """Starts the save of ``checkpointables`` (name -> value: a pytree,
        bytes or ``shardkeep.JsonValue``); None when the step is not saved.
        ``custom_metadata`` is kept with the step (``metadata(step)``)."""
        check("Checkpointer.save", {
            "overwrite": Unsupported(overwrite, False, "a step is never saved twice; save the"
                                     " next step"),
        })
        if not self._steps.save(step, sk.Checkpointables(checkpointables), metrics=metrics,
                                force=force, custom_metadata=custom_metadata):
            return None
        return AsyncResponse(self)

    # -- load ------------------------------------------------------------

    def load(self, step: Any = None, abstract_state: Any = None, *,
             checkpointable_name: str = _STATE) -> Any:
        """Loads the pytree ``checkpointable_name`` of ``step`` (a step, a
        ``CheckpointMetadata`` or None: the latest) onto ``abstract_state``."""
        return self.load_checkpointables(step, {checkpointable_name: abstract_state}
                                         )[checkpointable_name]

    def load_checkpointables(self, step: Any = None,
                             abstract_checkpointables: dict[str, Any] | None = None
                             ) -> dict[str, Any]:
        """Loads the checkpointables ``abstract_checkpointables`` names (None: all of them)."""
        if isinstance(step, CheckpointMetadata):
            step = step.step
        target = sk.Checkpointables(abstract_checkpointables or {})
        return dict(self._manager.load(step, target))

    save_pytree = save
    save_pytree_async = save_async
    load_pytree = load

    # -- waiting and closing ---------------------------------------------

    def is_saving_in_progress(self) -> bool:
        """Whether a save started here has not yet been seen committed."""
        return self._steps.saving()

    def wait(self) -> None:
        """Waits for the save in flight and the deletions it causes; raises their errors."""
        self._steps.wait()

    def close(self) -> None:
        self._steps.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._manager.__exit__(exc_type, exc, tb)
