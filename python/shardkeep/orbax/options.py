"""Orbax's ``CheckpointManagerOptions`` and ``AsyncOptions``, as shardkeep's manager arguments.

The fields, their order and defaults are Orbax's (orbax-checkpoint 0.12),
but for ``multiprocessing_options`` and ``file_options``, None here (their
defaults). ``manager_arguments`` maps them onto ``shardkeep.CheckpointManager``:

* when to save: ``save_decision_policy``, or Orbax's default policy built
  from ``save_interval_steps``, ``save_on_steps`` and ``should_save_fn``
  (with a save at a preemption and at the first step of an empty root);
* what to keep: ``preservation_policy``, or Orbax's default built from
  ``max_to_keep``, ``keep_period``, ``keep_time_interval``, ``best_fn``,
  ``best_mode`` and ``keep_checkpoints_without_metrics``;
* ``enable_async_checkpointing`` is ``async_save``;
  ``step_format_fixed_length`` the step folders' ``step_width`` (None:
  no zero padding, Orbax's names); ``async_options.timeout_secs`` the
  ``Options.timeout_s`` of every wait.

The others are accepted at the values shardkeep behaves as (docs/ORBAX.md)
and refused otherwise (``shardkeep.orbax.refusals``).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable, ClassVar, Collection

import shardkeep as sk

from .refusals import Unsupported, check

_CLASS = "CheckpointManagerOptions"


@dataclasses.dataclass
class AsyncOptions:
    timeout_secs: int = 1200
    barrier_sync_fn: Any = None
    post_finalization_callback: Callable[[], None] | None = None
    create_directories_asynchronously: bool = True


@dataclasses.dataclass
class CheckpointManagerOptions:
    save_interval_steps: int = 1
    max_to_keep: int | None = None
    keep_time_interval: datetime.timedelta | None = None
    keep_period: int | None = None
    best_fn: Callable[[Any], float] | None = None
    best_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True
    step_prefix: str | None = None
    step_format_fixed_length: int | None = None
    step_name_format: Any = None
    create: bool = True
    cleanup_tmp_directories: bool = False
    save_on_steps: Collection[int] | None = None
    single_host_load_and_broadcast: bool = False
    todelete_subdir: str | None = None
    todelete_full_path: str | None = None
    enable_background_delete: bool = False
    num_deletion_threads: int | None = None
    read_only: bool = False
    enable_async_checkpointing: bool = True
    async_options: AsyncOptions | None = None
    multiprocessing_options: Any = None
    should_save_fn: Callable[[int, int | None], bool] | None = None
    file_options: Any = None
    atomicity_options: Any = None
    save_root_metadata: bool = True
    temporary_path_class: Any = None
    save_decision_policy: Any = None
    preservation_policy: Any = None
    prevent_write_metrics: bool = False
    enable_should_save_is_saving_in_progress_check: bool = True
    enable_per_process_directory_creation: bool = False
    lightweight_initialize: bool = False

    def __post_init__(self):
        if self.best_mode not in ("min", "max"):
            raise sk.InvalidArgumentError(
                f"{_CLASS}.best_mode must be 'min' or 'max', got {self.best_mode!r}")


def manager_arguments(options: CheckpointManagerOptions) -> dict[str, Any]:
    """The keyword arguments of ``shardkeep.CheckpointManager`` for ``options``."""
    _check_supported(options)
    width = options.step_format_fixed_length
    return dict(save_decision_policy=_save_policy(options),
                preservation_policy=_preservation_policy(options),
                async_save=bool(options.enable_async_checkpointing),
                step_width=1 if width is None else width,
                options=None if options.async_options is None
                else sk.Options(timeout_s=float(options.async_options.timeout_secs)))


@dataclasses.dataclass(frozen=True)
class ShouldSaveFnPolicy:
    """Orbax's ``should_save_fn(step, last saved step or None)`` as a policy;
    a function of the steps, asked on every process as Orbax asks it."""

    should_save_fn: Callable[[int, int | None], bool]
    same_on_every_process: ClassVar[bool] = True

    def should_save(self, step, previous_steps, *, context) -> bool:
        return bool(self.should_save_fn(step.step,
                                        previous_steps[-1].step if previous_steps else None))


def _save_policy(o: CheckpointManagerOptions) -> Any:
    if o.save_decision_policy is not None:
        return o.save_decision_policy
    if o.read_only:  # save() refuses to save; no policy is asked
        return sk.save_decisions.AnySavePolicy([])
    policies: list[Any] = []
    if o.should_save_fn is not None:
        policies.append(ShouldSaveFnPolicy(o.should_save_fn))
    else:
        if o.save_interval_steps is not None:
            _check_count("save_interval_steps", o.save_interval_steps)
            policies.append(sk.save_decisions.FixedIntervalPolicy(o.save_interval_steps))
        if o.save_on_steps:
            policies.append(sk.save_decisions.SpecificStepsPolicy(frozenset(o.save_on_steps)))
    policies.append(sk.save_decisions.PreemptionCheckpointingPolicy())
    if o.should_save_fn is None:
        policies.append(sk.save_decisions.InitialSavePolicy())
    return sk.save_decisions.AnySavePolicy(policies)


def _preservation_policy(o: CheckpointManagerOptions) -> Any:
    if o.preservation_policy is not None:
        return o.preservation_policy
    if o.read_only:  # a read-only manager deletes nothing
        return sk.preservation.PreserveAll()
    if o.max_to_keep is not None:
        _check_count("max_to_keep", o.max_to_keep)
    policies: list[Any] = []
    if o.keep_period is not None:
        _check_count("keep_period", o.keep_period)
        policies.append(sk.preservation.EveryNSteps(o.keep_period))
    if o.keep_time_interval is not None:
        policies.append(sk.preservation.EveryNSeconds(
            interval_secs=int(o.keep_time_interval.total_seconds())))
    if o.best_fn is not None:
        policies.append(sk.preservation.BestN(
            get_metric_fn=o.best_fn, reverse=o.best_mode == "min", n=o.max_to_keep,
            keep_checkpoints_without_metrics=o.keep_checkpoints_without_metrics))
    else:
        policies.append(sk.preservation.LatestN(o.max_to_keep))
    return sk.preservation.AnyPreservationPolicy(policies)


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise sk.InvalidArgumentError(
            f"{_CLASS}.{name} must be an integer >= 1 under shardkeep.orbax, got {value!r}")


def _check_supported(o: CheckpointManagerOptions) -> None:
    """Refuses, by name, every option shardkeep does not honour as given."""
    names = "step folders are named by the step alone (and step_format_fixed_length)"
    deletes = "shardkeep deletes dropped steps itself, after each commit (docs/MANAGER.md)"
    orbax_only = "an option of Orbax's own machinery, with no shardkeep counterpart"
    check(_CLASS, {
        "step_prefix": Unsupported(o.step_prefix, None, names),
        "step_name_format": Unsupported(o.step_name_format, None, names),
        "create": Unsupported(o.create, True, "shardkeep creates the root at its first save"),
        "single_host_load_and_broadcast": Unsupported(
            o.single_host_load_and_broadcast, False,
            "every process lists the root once, when the manager is created"),
        "todelete_subdir": Unsupported(o.todelete_subdir, None, deletes),
        "todelete_full_path": Unsupported(o.todelete_full_path, None, deletes),
        "num_deletion_threads": Unsupported(o.num_deletion_threads, None, deletes),
        "file_options": Unsupported(o.file_options, None, orbax_only),
        "atomicity_options": Unsupported(
            o.atomicity_options, None, "a shardkeep step is committed by its commit record"
            " (docs/FORMAT.md)"),
        "temporary_path_class": Unsupported(o.temporary_path_class, None, orbax_only),
        "prevent_write_metrics": Unsupported(
            o.prevent_write_metrics, False, "metrics are kept in the step's commit record;"
            " pass no metrics to save none"),
        "enable_should_save_is_saving_in_progress_check": Unsupported(
            o.enable_should_save_is_saving_in_progress_check, True, orbax_only),
        "enable_per_process_directory_creation": Unsupported(
            o.enable_per_process_directory_creation, False, orbax_only),
        "lightweight_initialize": Unsupported(
            o.lightweight_initialize, False, "the manager reads every step's commit record"
            " once, when it is created"),
    })
    if o.multiprocessing_options is not None:
        mp = o.multiprocessing_options
        check(f"{_CLASS}.multiprocessing_options", {
            "primary_host": Unsupported(getattr(mp, "primary_host", 0), 0,
                                        "process 0 is always the primary"),
            "active_processes": Unsupported(getattr(mp, "active_processes", None), None,
                                            "every process of the job takes part"),
            "barrier_sync_key_prefix": Unsupported(
                getattr(mp, "barrier_sync_key_prefix", None), None,
                "the manager names its collective calls by its root"),
        })
    if o.async_options is not None:
        ao = o.async_options
        check(f"{_CLASS}.async_options", {
            "barrier_sync_fn": Unsupported(getattr(ao, "barrier_sync_fn", None), None,
                                           orbax_only),
            "post_finalization_callback": Unsupported(
                getattr(ao, "post_finalization_callback", None), None,
                "call wait_until_finished(), then run it"),
        })
