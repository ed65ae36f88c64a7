"""CheckpointManager: one checkpoint per step under a root directory.

How a manager works (docs/MANAGER.md has the user-facing rules):

1. At creation the root is listed once, by the C++ core
   (``_core.list_checkpoints``, through the Storage interface, so every
   backend works): by the primary, which shares the listing with the
   other processes through JAX's coordination service (each listing by
   itself could race with deletions the primary is still finishing). A
   step is an entry named by digits only whose ``_SHARDKEEP`` the core's
   decoder accepts (the reader's own check: format, version, fields); its
   metrics come from that record. The primary removes stale
   leftovers with the core's ``collect_leftovers`` (the policy of
   ``shardkeep gc``): ``*.shardkeep-tmp`` and ``*.shardkeep-deleting``
   folders, ``<step>.shardkeep-old`` when ``<step>`` itself is committed
   (otherwise it is the only copy, state "only-copy", and stays), and on
   object stores the "unfinished" folders: no ``_SHARDKEEP``, only
   ``.shardkeep-g<id>`` generations of saves that never committed (or of
   a deletion cut short).
2. From then on the manager never lists the root again: its record of
   committed steps is what it found plus what it committed. Every decision
   (save or skip, what to delete) is a function of that record and of
   values identical on all processes, so all processes decide alike.
3. ``save`` starts a save of ``<root>/<step>`` and hands its future to the
   manager's worker thread. The worker waits for the commit, adds the step
   to the record, applies the retention policy, and (primary only) deletes
   the dropped steps through the core: rename to
   ``<name>.shardkeep-deleting``, then remove, so a half-deleted checkpoint
   never looks committed. A step being loaded is removed from the record
   at once but deleted only after the load.
4. Errors of the worker (failed saves, failed deletions) are logged when
   they happen and raised by the next ``save``, ``wait`` or ``close``.
   What a failed save left (``<step>.shardkeep-tmp``; on object stores the
   generations inside ``<step>``) is removed (primary) before the next save
   starts, so that one failure's partial files (a full disk's) do not make
   every later save fail too.
5. With a ``local_root``, ``shardkeep.manager.local_tier`` saves each process's
   slice (and a copy of its ring predecessor's) to that per-process root
   at its own interval; the worker observes those commits too and applies
   ``local_keep_last`` per slice folder. ``restore`` (collective) picks
   the newest step either tier can rebuild.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import logging
import math
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from .. import _core
from ..job import distributed
from .. import options as options_lib
from . import (leftovers, local_tier, policy_arguments, policy_info, preservation,
               save_decisions, step_agreement)
from ..base import named_parts
from ..saving import staging_pool
from ..errors import InvalidArgumentError, NotFoundError, ShardkeepError, TimeoutError
from ..loading.load import load
from .preemption import PreemptionWatch
from ..saving.save import SaveFuture, prepare_staging, start_save

logger = logging.getLogger("shardkeep")

# Slack on top of Options.timeout_s, which already bounds every wait of a save.
_WAIT_SLACK_S = 60.0


@dataclasses.dataclass
class _Commit:
    """A started save, waiting in the worker for its commit."""

    step: int
    name: str
    future: SaveFuture
    metrics: dict
    started: float                    # time.monotonic()
    started_time: datetime.datetime   # the manager's clock
    base: int | None  # the step it takes unchanged arrays from, held until it ends
    observed: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class _Delete:
    """A step dropped by retention whose directory is still to be removed."""

    step: int
    name: str


@dataclasses.dataclass
class _Drain:
    """Marks the point up to which ``wait`` waits for the worker."""

    reached: threading.Event = dataclasses.field(default_factory=threading.Event)


class CheckpointManager:
    """Saves a training run every few steps and keeps the checkpoints that matter.

    ``save(step, tree_or_checkpointables)`` writes ``<root>/<step>`` (the step
    zero-padded to ``step_width`` digits) when the step is due: when
    ``save_decision_policy`` says so (``shardkeep.save_decisions``; by
    default a multiple of ``save_interval_steps`` or the step at which a
    preemption notice was agreed), or with ``force=True``. Decisions that
    only the primary process can make (time-based ones) land
    ``decision_lead_steps`` steps later on every process
    (``shardkeep.manager.step_agreement``). ``clock`` (seconds since the
    epoch) is the primary's clock for them. A ``shardkeep.Checkpointables`` is saved
    as its named parts (each loadable alone); anything else, a plain dict
    included, as the one tree "state", as ``shardkeep.save`` does (see
    ``shardkeep.base.named_parts``). With ``async_save`` the call returns after
    the device-to-host copy and at most one save is in flight.

    Retention (``preservation_policy``, see ``shardkeep.preservation``; or
    its short forms ``keep_last``, ``keep_every_steps``, ``keep_best`` by
    ``best_metric`` in ``best_mode``) runs after each commit and never
    deletes the newest step; see docs/MANAGER.md.

    ``local_root`` (a path per process; ``{process}`` in it is replaced by
    the process index) adds a local tier: every
    ``local_save_interval_steps`` steps (or when
    ``local_save_decision_policy`` says so) each process saves its part of the
    state there and a copy of a peer's, keeping ``local_keep_last`` steps;
    ``restore`` resumes from the newest step either tier can rebuild (see
    ``shardkeep.manager.local_tier`` and docs/MANAGER.md, "Local tier").

    With ``reuse_unchanged`` (the default), each save takes the arrays that
    have not changed since the latest committed step (the same
    ``jax.Array`` objects saved there, or loaded from there) from that step
    instead of writing them again: the new step links its data files (on
    an object store, the server copies them), and stays whole when that
    step is deleted (see
    ``shardkeep.save``'s ``base`` and docs/INCREMENTAL.md). The step being
    reused is not deleted before the save that reuses it has ended.
    ``Options(compare_with_base=True)`` also links arrays rebuilt with
    equal values, found by comparing. The local tier always compares each
    box with its previous local step's (docs/MANAGER.md, "Local save").

    The root is a file-system path (or ``file://``), an ``s3://bucket/prefix``
    (configured by the environment or ``options.s3``, see
    ``shardkeep.S3Settings``) or any other URL the core resolves
    (``memory://`` in tests), shared by all processes of the job.
    Methods are meant to be called from one thread, the training loop; the
    manager owns one worker thread, which ``close`` joins.
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
        self._root = _root_url(root)
        self._reuse = bool(reuse_unchanged)
        save_decisions.check_positive("step_width", step_width)
        save_decisions.check_positive("decision_lead_steps", decision_lead_steps)
        save_policy = policy_arguments.save_policy(save_decision_policy, save_interval_steps)
        local_policy = None
        if local_root is None and (local_save_interval_steps is not None
                                   or local_save_decision_policy is not None):
            raise InvalidArgumentError("local_save_interval_steps and"
                                       " local_save_decision_policy need a local_root")
        if local_root is not None:
            local_policy = policy_arguments.local_save_policy(local_save_decision_policy,
                                                              local_save_interval_steps)
            save_decisions.check_positive("local_keep_last", local_keep_last)
        self._preservation, self._best = policy_arguments.preservation_policy(
            preservation_policy, keep_last=keep_last, keep_every_steps=keep_every_steps,
            keep_best=keep_best, best_metric=best_metric, best_mode=best_mode)
        self._async = bool(async_save)
        self._staging_prepared = False  # see save()
        self._options = options_lib.resolve(options)
        self._width = step_width
        self._primary = jax.process_index() == 0
        self._clock = clock
        self._lead = decision_lead_steps

        self._lock = threading.Lock()  # guards the fields up to _errors
        self._steps: dict[int, dict] = {}       # committed step -> its metrics
        self._created_ns: dict[int, int] = {}   # committed step -> its record's created_ns
        # Step saved by this manager -> its start by ``clock`` (save decisions).
        self._started_times: dict[int, datetime.datetime] = {}
        self._record_version = 0  # counts the changes of the record above
        self._previous_cache: tuple[int, _Commit | None, list] | None = None  # see _previous
        self._names: dict[int, str] = {}        # committed step -> directory name
        self._in_use: collections.Counter = collections.Counter()
        self._deferred: dict[int, str] = {}     # dropped while in use: step -> name
        self._errors: list[BaseException] = []
        self._leftovers: list[str] = []         # what failed saves may have left

        self._pending: _Commit | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._closed = False

        # What every process calls this manager: names its collective calls.
        self._job_id = distributed.agree("manager", self._root, self._options.timeout_s)
        self._discover()
        self._decider = save_decisions.Decider(save_policy, lambda: self._agreement("saves"))
        self._local: local_tier.LocalTier | None = None
        self._local_pending: list[local_tier.LocalSave] = []
        if local_root is not None and local_policy is not None:  # both, or neither
            self._local = local_tier.LocalTier(
                local_root,
                decider=save_decisions.Decider(local_policy,
                                               lambda: self._agreement("local saves")),
                keep_last=local_keep_last, options=self._options, width=step_width,
                job=self._root, reuse=self._reuse, clock=clock)
        self._worker = threading.Thread(target=self._work, name="shardkeep-manager",
                                        daemon=True)
        self._worker.start()
        self._preemption = PreemptionWatch()

    # -- queries ---------------------------------------------------------

    @property
    def root(self) -> str:
        return self._root

    def all_steps(self) -> list[int]:
        """Committed steps, in increasing order."""
        with self._lock:
            return sorted(self._steps)

    def latest_step(self) -> int | None:
        """The latest committed step, or None."""
        with self._lock:
            return max(self._steps, default=None)

    def best_step(self) -> int | None:
        """The committed step with the best metric (``best_metric``, or the
        first ``BestN`` of ``preservation_policy``), or None."""
        if self._best is None:
            return None
        with self._lock:
            best = self._best.ranked(self._committed())
        return best[0].step if best else None

    def metrics(self, step: int) -> dict:
        """The metrics committed step ``step`` was saved with."""
        with self._lock:
            if step not in self._steps:
                raise NotFoundError(self._not_committed(step))
            return dict(self._steps[step])

    def step_path(self, step: int) -> str:
        """Where step ``step`` is (or would be) saved."""
        with self._lock:
            name = self._names.get(step) or _core.step_folder_name(step, self._width)
        return _join(self._root, name)

    def reached_preemption(self, step: int) -> bool:
        """True once a preemption notice has arrived and ``step`` is the agreed step or later.

        Call it at every step (``save`` does): in multi-process jobs JAX's
        sync point needs every process to report every step.
        """
        return self._preemption.reached(step)

    # -- save ------------------------------------------------------------

    def save(self, step: int, tree_or_checkpointables: Any, *, metrics: Mapping | None = None,
             force: bool = False) -> bool:
        """Saves ``step`` if it is due; returns whether a save was started.

        Raises the error of an earlier background save or deletion, if any.
        A step not after the last saved one is not saved (False).
        """
        self._check_open()
        step = _checked_step(step)
        self._raise_errors()
        preempted = self.reached_preemption(step)
        # Asked at every step, forced or not: see save_decisions.Decider.
        due = self._decider.due(
            step, self._previous(),
            save_decisions.DecisionContext(is_saving_in_progress=self._saving(),
                                           reached_preemption=preempted),
            policy_info.time_of_seconds(self._clock())) or force
        local = self._local if self._local is not None and self._local.due(
            step, save_decisions.DecisionContext(
                is_saving_in_progress=any(not j.observed.is_set() for j in self._local_pending),
                reached_preemption=preempted)) else None
        local_due = local is not None
        last = self._last_started()
        if due and last is not None and step <= last:
            logger.warning("step %d not saved: step %d is already saved under %s", step, last,
                           self._root)
            due = False
        if not (due or local_due):
            if self._async and not self._staging_prepared:
                # The first async save then copies into memory already touched.
                self._staging_prepared = True
                prepare_staging(named_parts.to_save(tree_or_checkpointables), self._options)
            return False
        self._staging_prepared = True
        metrics = _plain_metrics(metrics)
        items = named_parts.to_save(tree_or_checkpointables)
        if due:
            self._save_persistent(step, items, metrics)
        if local is not None:
            self._save_local(local, step, items)
        return True

    def _save_local(self, local: local_tier.LocalTier, step: int, items: dict) -> None:
        self._wait_local()  # at most one local step in flight
        saves = local.save(step, items)
        for job in saves:
            self._local_pending.append(job)
            self._jobs.put(job)
        if not self._async:
            self._wait_local()

    def _save_persistent(self, step: int, items: dict, metrics: dict) -> None:
        self._wait_pending()
        self._remove_leftovers()
        name = _core.step_folder_name(step, self._width)
        started = time.monotonic()
        started_time = policy_info.time_of_seconds(self._clock())
        base = self._hold_base()
        try:
            future = start_save(
                _join(self._root, name), items, asynchronous=self._async, metrics=metrics,
                step=step, options=self._options,
                base=None if base is None else _join(self._root, self._names[base]))
        except Exception:
            self._note_leftover(name)
            if base is not None:
                self._release(base)
            raise
        logger.info("step %d: save started, blocking phase %.3f s", step,
                    time.monotonic() - started)
        self._pending = _Commit(step, name, future, metrics, started, started_time, base)
        self._jobs.put(self._pending)
        if not self._async:
            self._wait_pending()

    # -- load ------------------------------------------------------------

    def load(self, step: int | None = None, target: Any = None, *, partial: bool = False,
             options: options_lib.Options | None = None) -> Any:
        """Loads committed step ``step`` (None: the latest).

        ``target`` is that of ``shardkeep.load``: a ``Checkpointables``
        names the parts to load (reading no others; an empty one loads
        every part) and a Checkpointables is returned; anything else, None
        and plain dicts included, is the target of "state", returned alone.
        The step is not deleted while it is being loaded. ``options`` None
        are the manager's; given ones without ``s3`` settings take the
        manager's, so the root's store is the one read.
        """
        self._check_open()
        with self._lock:
            if step is None:
                if not self._steps:
                    raise NotFoundError(f"no committed checkpoint under {self._root!r}")
                step = max(self._steps)
            elif step not in self._steps:
                raise NotFoundError(self._not_committed(step))
            self._in_use[step] += 1
            path = _join(self._root, self._names[step])
        if options is None:
            options = self._options
        elif options.s3 is None:  # the root's store stays the one to read from
            options = dataclasses.replace(options, s3=self._options.s3)
        try:
            return load(path, target, partial=partial, options=options)
        finally:
            self._release(step)

    def restore(self, target: Any = None, *, partial: bool = False,
                options: options_lib.Options | None = None) -> tuple[int, Any] | None:
        """Loads the newest step either tier can rebuild; returns (step, value) or None.

        Collective: every process of the job calls it. With a local tier,
        the processes agree on the newest step whose every slice some
        process's local root holds (its own slices and its peer copies);
        that step is loaded from the local roots when it is not older than
        the latest persistent step, which is loaded otherwise. ``target``,
        ``partial`` and ``options`` are those of ``load``. None when
        neither tier has a step.
        """
        self._check_open()
        # The local saves in flight first: listing the local root removes
        # what looks like the leftovers of unfinished saves.
        self._wait_local()
        persistent = self.latest_step()
        local = self._local
        decision = local.decide() if local is not None else None
        if local is not None and decision is not None and (
                persistent is None or decision.step >= persistent):
            if options is None:
                options = self._options
            values = local.load(decision, named_parts.to_load(target), partial=partial,
                                options=options)
            return decision.step, named_parts.loaded(target, values)
        if decision is not None:
            logger.info("local step %d is older than persistent step %d, which is loaded",
                        decision.step, persistent)
        if persistent is None:
            return None
        return persistent, self.load(persistent, target, partial=partial, options=options)

    def local_steps(self) -> dict[int, list[int]]:
        """The committed local steps in this process's local root, per slice
        folder: {process q: steps of p<q>} ({} without a local tier)."""
        if self._local is None:
            return {}
        with self._lock:
            return {q: sorted(steps) for q, steps in self._local.held.items() if steps}

    # -- waiting and closing ---------------------------------------------

    def wait(self) -> None:
        """Waits for the save in flight and for pending deletions; raises their errors.

        The temporary folders of failed saves are removed before it returns.
        """
        try:
            self._wait_pending()
            self._wait_local()
            drain = _Drain()
            self._jobs.put(drain)
            if not drain.reached.wait(self._options.timeout_s + _WAIT_SLACK_S):
                raise TimeoutError(f"checkpoint deletions under {self._root!r} did not finish"
                                   f" within {self._options.timeout_s + _WAIT_SLACK_S:.0f} s")
        finally:
            self._remove_leftovers()
        self._raise_errors()

    def close(self) -> None:
        """Waits like ``wait``, then stops the worker, restores the SIGTERM
        handler and frees the staging memory kept for async saves (see
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
            self._jobs.put(None)
            self._worker.join(self._options.timeout_s + _WAIT_SLACK_S)
            if self._worker.is_alive():
                logger.error("the worker of the manager of %s did not stop", self._root)
            self._preemption.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # The exception already propagating is the one to see.
            logger.exception("closing the manager of %s while handling another error",
                             self._root)

    # -- internals -------------------------------------------------------

    def _discover(self) -> None:
        if jax.process_count() == 1:
            found = self._list_root()
        else:
            found = self._agreed_listing()
        for name, (metrics, created_ns) in found.items():
            step = _core.step_of_folder(name)
            if step is None:  # the primary's listing holds step folders alone
                raise ShardkeepError(f"the listing of {self._root!r} names {name!r}, no step")
            self._steps[step] = metrics
            self._created_ns[step] = created_ns
            self._names[step] = name

    def _agreed_listing(self) -> dict[str, tuple[dict, int]]:
        """The primary's listing, shared through JAX's coordination service.

        Listing on every process would race with deletions the primary
        may still be finishing for an earlier manager of the same root.
        """
        bridge = distributed.coordination()
        key = self._job_id + "/steps"
        if self._primary:
            found = self._list_root()
            bridge.set(key, json.dumps(found))
            return found
        return {name: (metrics, created_ns) for name, (metrics, created_ns)
                in json.loads(bridge.get(key, self._options.timeout_s)).items()}

    def _agreement(self, name: str):
        """How the primary's save decisions of kind ``name`` reach every process."""
        if jax.process_count() == 1:
            return step_agreement.Immediate()
        return step_agreement.StepAgreement(
            distributed.coordination(), f"{self._job_id}/{name}", lead=self._lead,
            timeout_s=self._options.timeout_s)

    def _list_root(self) -> dict[str, tuple[dict, int]]:
        """{directory name: (metrics, created_ns)} of the committed steps; the
        primary collects garbage."""
        found: dict[str, tuple[dict, int]] = {}
        entries = _core.list_checkpoints(self._root, self._options.to_core())
        for entry in entries:
            name = entry.name
            step = _core.step_of_folder(name)
            if step is None:
                continue
            if entry.state is _core.EntryState.REJECTED:
                logger.warning("%s is ignored: %s", _join(self._root, name), entry.problem)
                continue
            record = entry.commit
            if record is None:
                continue
            twin = next((n for n in found if _core.step_of_folder(n) == step), None)
            if twin is not None:
                logger.warning("step %d is in both %s and %s; using %s", step, twin, name,
                               twin)
                continue
            found[name] = (record.metrics, record.created_ns)
        if self._primary:
            leftovers.collect(self._root, entries, self._options)
        return found

    def _note_leftover(self, name: str) -> None:
        # The temporary folder (storage with rename), or the step's own
        # folder holding uncommitted generations (object stores); the core
        # removes whichever exists and refuses anything else.
        with self._lock:
            self._leftovers += [_core.temporary_folder(_join(self._root, name)),
                                _join(self._root, name)]

    def _remove_leftovers(self) -> None:
        """Removes the leftovers of failed saves (primary): before a save, in ``wait``.

        A failed save may leave its partial ``<step>.shardkeep-tmp`` (or, on
        object stores, generations inside ``<step>``) behind (the disk
        filled up, say); every step goes to a new path, so without this
        they would pile up and keep the disk full. One that cannot be
        removed now is tried again before the following save.
        """
        with self._lock:
            paths, self._leftovers = self._leftovers, []
        if not self._primary:
            return
        kept = [path for path in paths if not leftovers.remove_quietly(path, self._options)]
        if kept:
            with self._lock:
                self._leftovers[:0] = kept

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if isinstance(job, _Commit):
                self._observe_commit(job)
            elif isinstance(job, local_tier.LocalSave):
                self._observe_local(job)
            elif isinstance(job, _Delete):
                self._delete(job)
            else:
                job.reached.set()

    def _observe_commit(self, job: _Commit) -> None:
        try:
            job.future.result()
        except Exception as e:  # noqa: BLE001 - recorded, raised on the next call
            self._record_error(f"saving step {job.step} to {job.future.path!r} failed", e)
            self._note_leftover(job.name)
            if job.base is not None:
                self._release(job.base)
            job.observed.set()
            return
        logger.info("step %d committed, %.2f s after its save started", job.step,
                    time.monotonic() - job.started)
        refused = None
        with self._lock:
            self._record_version += 1  # also covers the deletions below
            self._steps[job.step] = job.metrics
            self._created_ns[job.step] = job.future.created_ns() or 0
            self._started_times[job.step] = job.started_time
            self._names[job.step] = job.name
            try:
                dropped = preservation.steps_to_delete(self._committed(), self._preservation)
            except Exception as e:  # noqa: BLE001 - the policy's: raised on the next call
                dropped, refused = [], e
            deletions = []
            for step in dropped:
                del self._steps[step]
                del self._created_ns[step]
                self._started_times.pop(step, None)
                name = self._names.pop(step)
                if self._in_use[step]:
                    self._deferred[step] = name
                else:
                    deletions.append(_Delete(step, name))
        if refused is not None:
            self._record_error(f"the preservation policy failed once step {job.step} had"
                               " committed; no step was deleted", refused)
        if job.base is not None:
            self._release(job.base)
        job.observed.set()
        for deletion in deletions:
            self._delete(deletion)

    def _observe_local(self, job: local_tier.LocalSave) -> None:
        try:
            job.future.result()
        except Exception as e:  # noqa: BLE001 - recorded, raised on the next call
            self._record_error(f"local save of step {job.step} to {job.future.path!r} failed",
                               e)
            job.observed.set()
            return
        logger.info("local step %d (slice %d) committed, %.2f s after its save started",
                    job.step, job.folder, time.monotonic() - job.started)
        local = self._local
        assert local is not None  # a local save was made
        with self._lock:
            dropped = local.committed(job)
        job.observed.set()
        for path in dropped:
            try:
                _core.delete_checkpoint(path, self._options.to_core())
            except ShardkeepError as e:
                self._record_error(f"deleting local checkpoint {path!r} failed", e)

    def _wait_local(self) -> None:
        limit = self._options.timeout_s + _WAIT_SLACK_S
        while self._local_pending:
            job = self._local_pending[0]
            if not job.observed.wait(limit):
                raise TimeoutError(f"local step {job.step} was not committed within"
                                   f" {limit:.0f} s; it continues in the background")
            self._local_pending.pop(0)
        self._raise_errors()

    def _delete(self, job: _Delete) -> None:
        if not self._primary:
            return
        path = _join(self._root, job.name)
        try:
            _core.delete_checkpoint(path, self._options.to_core())
        except ShardkeepError as e:
            self._record_error(f"deleting step {job.step} at {path!r} failed", e)
            return
        logger.info("deleted step %d (%s)", job.step, path)

    def _hold_base(self) -> int | None:
        """The step a save takes its unchanged arrays from (the latest
        committed), kept from deletion until ``_release``; None when the
        manager does not reuse or has no step."""
        if not self._reuse:
            return None
        with self._lock:
            base = max(self._steps, default=None)
            if base is not None:
                self._in_use[base] += 1
            return base

    def _release(self, step: int) -> None:
        with self._lock:
            self._in_use[step] -= 1
            if self._in_use[step]:
                return
            del self._in_use[step]
            name = self._deferred.pop(step, None)
        if name is not None:
            self._jobs.put(_Delete(step, name))

    def _committed(self) -> list[policy_info.PolicyCheckpointInfo]:
        """The committed steps as the policies see them, oldest first (holding the lock)."""
        return [policy_info.PolicyCheckpointInfo(step, self._steps[step],
                                           policy_info.time_of_ns(self._created_ns[step]))
                for step in sorted(self._steps)]

    def _previous(self) -> list[policy_info.PolicyCheckpointInfo]:
        """The steps saved so far as the save decisions see them: committed,
        then the one in flight. The steps this manager saved are timed by
        its ``clock`` (the clock "now" is read from), the others by their
        records.

        Asked at every training step: the list is rebuilt only when the
        record or the save in flight has changed since the last call.
        """
        pending = self._pending
        with self._lock:
            cache = self._previous_cache
            # The save in flight by identity (the cache holds it: no reused id).
            if cache is not None and cache[0] == self._record_version and cache[1] is pending:
                return cache[2]
            previous = [dataclasses.replace(info, time=self._started_times.get(info.step,
                                                                               info.time))
                        for info in self._committed()]
            if pending is not None and pending.step not in self._steps:
                previous.append(policy_info.PolicyCheckpointInfo(pending.step, pending.metrics,
                                                                 pending.started_time))
            self._previous_cache = (self._record_version, pending, previous)
        return previous

    def _saving(self) -> bool:
        """A save has started and its commit (or failure) is not yet observed."""
        return self._pending is not None and not self._pending.observed.is_set()

    def _last_started(self) -> int | None:
        """The step of the save in flight, else the latest committed step."""
        if self._pending is not None:
            return self._pending.step
        return self.latest_step()

    def _wait_pending(self) -> None:
        pending = self._pending
        if pending is not None:
            limit = self._options.timeout_s + _WAIT_SLACK_S
            if not pending.observed.wait(limit):
                raise TimeoutError(f"step {pending.step} was not committed within {limit:.0f} s;"
                                   " it continues in the background")
            self._pending = None
        self._raise_errors()

    def _record_error(self, what: str, error: BaseException) -> None:
        logger.error("%s: %s", what, error)
        described = _described(error, f"{what}: {error}")
        with self._lock:
            self._errors.append(described)

    def _raise_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if not errors:
            return
        if len(errors) > 1:
            others = "; ".join(str(e) for e in errors[1:])
            raise _described(errors[0], f"{errors[0]} (and {len(errors) - 1} more: {others})")
        raise errors[0]

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError(f"the manager of {self._root!r} is closed")

    def _not_committed(self, step: int) -> str:
        return (f"step {step} is not a committed checkpoint under {self._root!r};"
                f" committed steps: {sorted(self._steps)}")


def _root_url(root) -> str:
    """``root``'s canonical key (``_core.Location``): an absolute path, or a
    URL of another backend; InvalidArgumentError for one no backend reads."""
    return _core.Location(os.fspath(root)).key


_join = leftovers.join


def _plain_metrics(metrics: Mapping | None) -> dict:
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


def _described(error: BaseException, message: str) -> BaseException:
    """An error of the same class as ``error`` (when possible) saying ``message``."""
    try:
        described = type(error)(message)
    except Exception:  # noqa: BLE001 - classes whose constructor takes other arguments
        described = ShardkeepError(message)
    described.__cause__ = error
    return described


def _checked_step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise InvalidArgumentError(f"step must be a non-negative int, got {step!r}")
    return int(step)
