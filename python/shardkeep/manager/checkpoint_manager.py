"""CheckpointManager: one checkpoint per step under a root directory.

docs/MANAGER.md has the user-facing rules. The manager is this facade
over modules with one role each:

- the record of steps (``step_record``), started by the one listing of
  the root at creation (``step_listing``), never listed again: every
  decision (``save_decisions``, ``preservation``) is a function of it and
  of values identical on all processes, so all processes decide alike;
- the commit bookkeeping (``commits``): each save is owned by the
  process's save queue, whose thread runs the manager's ``on_finished``
  at the save's end (the step joins the record, retention runs, dropped
  steps are deleted by ``deletions``); the manager has no thread of its
  own, and ``wait`` waits on the save queue;
- the errors of that work (``background_errors``), raised by the next
  ``save``, ``wait`` or ``close``;
- the local tier (``local_tier``), whose slices end alike;
- the Orbax steps under the root (``orbax_steps``): listed, loaded,
  never deleted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable, Mapping

import jax

from .. import _core
from ..job import distributed
from .. import options as options_lib
from . import (commits, local_restore, local_tier, orbax_steps, policy_arguments, policy_info,
               preservation, save_decisions, step_agreement, step_listing, step_record)
from ..base import named_parts
from ..saving import staging_pool
from ..errors import InvalidArgumentError
from ..loading.load import load
from .background_errors import BackgroundErrors
from .deletions import Deletions
from .leftovers import join as _join
from .preemption import PreemptionWatch
from ..saving.save import (prepare_staging, stage_parts, start_save,
                           start_single_process_async)

logger = logging.getLogger("shardkeep")


class CheckpointManager:
    """Saves a training run every few steps and keeps the checkpoints that matter.

    ``save(step, tree_or_checkpointables)`` writes ``<root>/<step>`` (the step
    zero-padded to ``step_width`` digits) when the step is due: when
    ``save_decision_policy`` says so (``shardkeep.save_decisions``; by
    default a multiple of ``save_interval_steps`` or the step at which a
    preemption notice was agreed), or with ``force=True``. Decisions that
    only the primary process can make (time-based ones) land
    ``decision_lead_steps`` steps later on every process
    (``shardkeep.manager.step_agreement``); ``clock`` (seconds since the
    epoch) is the primary's clock for them. A ``shardkeep.Checkpointables``
    is saved as its named parts (each loadable alone); anything else, a
    plain dict included, as the one tree "state", as ``shardkeep.save``
    does (``shardkeep.base.named_parts``). With ``async_save`` it returns after
    the device-to-host copy and at most one save is in flight.

    Retention (``preservation_policy``, see ``shardkeep.preservation``; or
    its short forms ``keep_last``, ``keep_every_steps``, ``keep_best`` by
    ``best_metric`` in ``best_mode``) runs after each commit and never
    deletes the newest step nor an Orbax step (Orbax's step folders under
    the root are steps to load and resume from); see docs/MANAGER.md.

    ``local_root`` (a path per process; ``{process}`` in it is replaced by
    the process index) adds a local tier: every
    ``local_save_interval_steps`` steps (or when
    ``local_save_decision_policy`` says so) each process saves its part of the
    state there and a copy of a peer's, keeping ``local_keep_last`` steps;
    ``restore`` resumes from the newest step either tier can rebuild (see
    ``shardkeep.manager.local_tier`` and docs/MANAGER.md, "Local tier").

    With ``reuse_unchanged`` (the default), a save links the arrays that
    have not changed since the latest committed step (the same
    ``jax.Array`` objects, or equal values with
    ``Options(compare_with_base=True)``) instead of writing them again
    (``shardkeep.save``'s ``base``; docs/INCREMENTAL.md, docs/MANAGER.md).

    The root, shared by all processes of the job, is a file-system path
    (or ``file://``), an ``s3://bucket/prefix`` (configured by the
    environment or ``options.s3``: ``shardkeep.S3Settings``) or any URL
    the core resolves (``memory://`` in tests).
    Methods are meant to be called from one thread, the training loop; the
    manager has no thread of its own (its saves end on the save queue's).
    """

    def __init__(self, root, *, keep_last: int | None = None,
                 keep_every_steps: int | None = None, keep_best: int | None = None,
                 best_metric: str | None = None, best_mode: str = "min",
                 save_interval_steps: int | None = None,
                 save_decision_policy: save_decisions.SaveDecisionPolicy | None = None,
                 preservation_policy: preservation.PreservationPolicy | None = None,
                 async_save: bool = True,
                 options: options_lib.Options | None = None, step_width: int = 9,
                 local_root=None, local_save_interval_steps: int | None = None,
                 local_save_decision_policy: save_decisions.SaveDecisionPolicy | None = None,
                 local_keep_last: int = 2, reuse_unchanged: bool = True,
                 decision_lead_steps: int = 2, clock: Callable[[], float] = time.time):
        # The root's canonical key: an absolute path, or a URL of another
        # backend; InvalidArgumentError for one no backend reads.
        self._root = _core.Location(os.fspath(root)).key
        self._reuse = bool(reuse_unchanged)
        save_decisions.check_positive("step_width", step_width)
        save_decisions.check_positive("decision_lead_steps", decision_lead_steps)
        save_policy = policy_arguments.save_policy(save_decision_policy, save_interval_steps)
        local_policy = policy_arguments.local_save_policy(
            local_root, local_save_decision_policy, local_save_interval_steps, local_keep_last)
        self._preservation, self._best = policy_arguments.preservation_policy(
            preservation_policy, keep_last=keep_last, keep_every_steps=keep_every_steps,
            keep_best=keep_best, best_metric=best_metric, best_mode=best_mode)
        self._async = bool(async_save)
        self._staging_prepared = False  # see save()
        self._options = options_lib.resolve(options)
        self._width = step_width
        self._clock = clock
        self._lead = decision_lead_steps
        self._closed = False

        # What every process calls this manager: names its collective calls.
        self._job_id = distributed.agree("manager", self._root, self._options.timeout_s)
        self._record = step_record.StepRecord(
            self._root, step_listing.committed_steps(self._root, self._options, self._job_id))
        self._errors = BackgroundErrors()
        self._in_flight = commits.InFlight(self._options.timeout_s, self._errors)
        self._deletions = Deletions(self._root, self._options, jax.process_index() == 0,
                                    self._errors)
        self._book = commits.Bookkeeping(self._root, self._record, self._preservation,
                                         self._deletions, self._errors)
        self._decider = save_decisions.Decider(save_policy, lambda: self._agreement("saves"))
        self._local: local_tier.LocalTier | None = None
        if local_policy is not None:  # given a local_root
            self._local = local_tier.LocalTier(
                local_root,
                decider=save_decisions.Decider(local_policy,
                                               lambda: self._agreement("local saves")),
                keep_last=local_keep_last, options=self._options, width=step_width,
                job=self._root, reuse=self._reuse, clock=clock)
        self._preemption = PreemptionWatch()

    # -- queries ---------------------------------------------------------

    @property
    def root(self) -> str:
        return self._root

    def all_steps(self) -> list[int]:
        """Committed steps, in increasing order (Orbax's among them)."""
        return self._record.steps()

    def orbax_steps(self) -> list[int]:
        """The committed steps that are Orbax's, loaded but never deleted."""
        return self._record.orbax_steps()

    def latest_step(self) -> int | None:
        """The latest committed step, or None."""
        return self._record.latest()

    def best_step(self) -> int | None:
        """The committed step with the best metric (``best_metric``, or the
        first ``BestN`` of ``preservation_policy``), or None."""
        return None if self._best is None else self._record.ranked_first(self._best)

    def metrics(self, step: int) -> dict:
        """The metrics committed step ``step`` was saved with (an Orbax
        step's: those Orbax recorded, if any)."""
        return self._record.metrics(step)

    def custom_metadata(self, step: int) -> dict:
        """The custom metadata committed step ``step`` was saved with (an
        Orbax step's: the ``custom_metadata`` of its _CHECKPOINT_METADATA)."""
        path = _join(self._root, self._record.hold(step)[1])
        try:
            if self._record.is_orbax(step):
                return orbax_steps.custom_metadata(path)
            return dict(_core.Reader(path, self._options.to_core()).commit.custom_metadata)
        finally:
            self._book.release(step)

    def step_path(self, step: int) -> str:
        """Where step ``step`` is (or would be) saved."""
        name = self._record.name(step) or _core.step_folder_name(step, self._width)
        return _join(self._root, name)

    def reached_preemption(self, step: int) -> bool:
        """True once a preemption notice has arrived and ``step`` is the agreed step or later.

        Call it at every step (``save`` does): in multi-process jobs JAX's
        sync point needs every process to report every step.
        """
        return self._preemption.reached(step)

    # -- save ------------------------------------------------------------

    def save(self, step: int, tree_or_checkpointables: Any, *, metrics: Mapping | None = None,
             custom_metadata: Mapping | None = None, force: bool = False) -> bool:
        """Saves ``step`` if it is due; returns whether a save was started.

        ``custom_metadata`` (a JSON object; "shardkeep_" keys are shardkeep's)
        is kept in the step's commit record: ``custom_metadata(step)``. Raises
        an earlier background save's or deletion's error. A step not after
        the last saved one is not saved (False).
        """
        self._check_open()
        step = step_record.checked_step(step)
        custom_metadata = step_record.checked_custom_metadata(custom_metadata)
        self._errors.raise_first()
        preempted = self.reached_preemption(step)
        # Asked at every step, forced or not: see save_decisions.Decider.
        due = self._decider.due(
            step, self._record.previous(self._in_flight.commit),
            save_decisions.DecisionContext(is_saving_in_progress=self._in_flight.saving(),
                                           reached_preemption=preempted),
            policy_info.time_of_seconds(self._clock())) or force
        local = self._local if self._local is not None and self._local.due(
            step, save_decisions.DecisionContext(
                is_saving_in_progress=self._in_flight.saving_local(),
                reached_preemption=preempted)) else None
        # The step of the save in flight, else the latest committed step.
        last = self._in_flight.commit.step if self._in_flight.commit else self.latest_step()
        if due and last is not None and step <= last:
            logger.warning("step %d not saved: step %d is already saved under %s", step, last,
                           self._root)
            due = False
        if not (due or local is not None):
            if self._async and not self._staging_prepared:
                # The first async save then copies into memory already touched.
                self._staging_prepared = True
                prepare_staging(named_parts.to_save(tree_or_checkpointables), self._options)
            return False
        self._staging_prepared = True
        metrics = step_record.plain_metrics(metrics)
        items = named_parts.to_save(tree_or_checkpointables)
        if due:
            self._save_persistent(step, items, metrics, custom_metadata)
        if local is not None:
            self._save_local(local, step, items)
        return True

    def _save_local(self, local: local_tier.LocalTier, step: int, items: dict) -> None:
        self._in_flight.wait_local()  # at most one local step in flight
        local.begin(step, items)
        staged, lease = stage_parts(items, self._options, own_copies=True)
        on_end = local.on_end(self._errors, self._deletions.delete_local)
        for job in local.slices(step, staged.parts, lease):
            job.future = start_single_process_async(
                job.path, job.parts, options=self._options, step=step, force=True,
                custom_metadata=job.metadata, lease=job.lease, on_finished=on_end(job))
            self._in_flight.local.append(job)
        if not self._async:
            self._in_flight.wait_local()

    def _save_persistent(self, step: int, items: dict, metrics: dict,
                         custom_metadata: Mapping | None) -> None:
        self._in_flight.wait_commit()
        self._deletions.remove_leftovers()
        name = _core.step_folder_name(step, self._width)
        started = time.monotonic()
        # The step it takes unchanged arrays from, kept until the save ends.
        base = self._record.hold_latest() if self._reuse else None
        commit = commits.Commit(step, name, metrics, started,
                                policy_info.time_of_seconds(self._clock()),
                                None if base is None else base[0])
        try:
            commit.future = start_save(
                _join(self._root, name), items, asynchronous=self._async, metrics=metrics,
                custom_metadata=custom_metadata, step=step, options=self._options,
                base=None if base is None else _join(self._root, base[1]),
                on_finished=self._book.on_end(commit))
        except Exception:
            self._deletions.note_failed_save(name)
            if base is not None:
                self._book.release(base[0])
            raise
        logger.info("step %d: save started, blocking phase %.3f s", step,
                    time.monotonic() - started)
        self._in_flight.commit = commit
        if not self._async:
            self._in_flight.wait_commit()

    # -- load ------------------------------------------------------------

    def load(self, step: int | None = None, target: Any = None, *, partial: bool = False,
             options: options_lib.Options | None = None) -> Any:
        """Loads committed step ``step`` (None: the latest).

        ``target`` is that of ``shardkeep.load``: a ``Checkpointables``
        names the parts to load (reading no others; an empty one loads
        every part) and a Checkpointables is returned; anything else, None
        and plain dicts included, is the target of "state", returned alone.
        The step is not deleted while it is being loaded. An Orbax step's items
        are its parts (``default`` is "state"). ``options`` given without
        ``s3`` or ``gcs`` settings take the manager's.
        """
        self._check_open()
        step, name = self._record.hold(step)
        path = _join(self._root, name)
        options = self._options if options is None else dataclasses.replace(  # same store
            options, s3=options.s3 or self._options.s3, gcs=options.gcs or self._options.gcs)
        try:
            if self._record.is_orbax(step):
                return orbax_steps.load(path, target, partial=partial, options=options)
            return load(path, target, partial=partial, options=options)
        finally:
            self._book.release(step)

    def restore(self, target: Any = None, *, partial: bool = False,
                options: options_lib.Options | None = None) -> tuple[int, Any] | None:
        """Loads the newest step either tier can rebuild; returns (step, value) or None.

        Collective: every process of the job calls it. With a local tier,
        the processes agree on the newest step whose every slice some
        process's local root holds (``local_restore.restore``), loaded when
        not older than the latest persistent step, which is loaded
        otherwise; None when neither has one. The arguments are ``load``'s.
        """
        self._check_open()
        # The local saves in flight first: listing the local root removes
        # what looks like the leftovers of unfinished saves.
        self._in_flight.wait_local()
        persistent = self.latest_step()
        restored = None if self._local is None else local_restore.restore(
            self._local, persistent, target, partial=partial,
            options=self._options if options is None else options)
        if restored is not None:
            return restored
        if persistent is None:
            return None
        return persistent, self.load(persistent, target, partial=partial, options=options)

    def local_steps(self) -> dict[int, list[int]]:
        """The committed local steps in this process's local root, per slice
        folder: {process q: steps of p<q>} ({} without a local tier)."""
        return {} if self._local is None else self._local.steps()

    # -- waiting and closing ---------------------------------------------

    def wait(self) -> None:
        """Waits for the save in flight and for pending deletions; raises their errors.

        The deletions a commit causes are part of its save's end, so waiting
        for the save (on the save queue) waits for them. The temporary
        folders of failed saves are removed before it returns.
        """
        try:
            self._in_flight.wait_commit()
            self._in_flight.wait_local()
        finally:
            self._deletions.remove_leftovers()
        self._errors.raise_first()

    def close(self) -> None:
        """Waits like ``wait``, then restores the SIGTERM handler and frees
        the staging memory kept for async saves (see
        ``Options.reuse_staging_memory``)."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            staging_pool.release()
            self._closed = True
            self._decider.close()
            if self._local is not None:
                self._local.decider.close()
            self._preemption.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception:
            if exc_type is None:  # else the exception propagating is the one to see
                raise
            logger.exception("closing the manager of %s while handling another error",
                             self._root)

    # -- internals -------------------------------------------------------

    def _agreement(self, name: str):
        """How the primary's save decisions of kind ``name`` reach every process."""
        return step_agreement.of_job(f"{self._job_id}/{name}", lead=self._lead,
                                     timeout_s=self._options.timeout_s)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError(f"the manager of {self._root!r} is closed")

