"""The local tier: frequent saves to each process's own storage, with a peer copy.

docs/MANAGER.md ("Local tier") has the user-facing rules; this is how it works.

Layout. A process's local root holds folders ``p<q>``; ``p<q>/<step>`` is a
committed one-process checkpoint holding *slice* q of that step: the boxes
process q writes in a save of the whole job (the replica-parallel plan, so
the slices of all processes are disjoint and together tile every leaf).
Process p keeps its own slice in ``p<p>`` and a copy of its ring
predecessor's in ``p<(p-1) % P>``, so losing one process's root loses no
slice.

Each slice is a committed one-process checkpoint
(``shardkeep.manager.local_slices`` says how it holds a part of the job's
tree), whose commit record's custom_metadata says
``{"shardkeep_local": {"process": q, "process_count": P}}``.

Save (blocking phase, training thread): stage this process's boxes as a
save of the job does, send them to the successor with ``exchange_bytes``
(collective: every process saves the same steps) and receive the
predecessor's, then start both one-process saves in the background.

Restore (collective): each process lists its root and publishes which
slices of which steps it holds; every process then picks the same step:
the newest one whose every slice is held by some process.
``shardkeep.manager.local_restore`` loads it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Mapping

import jax

from .. import _core
from ..job import distributed, exchange
from . import leftovers, local_slices, policy_info, save_decisions
from .. import options as options_lib
from ..saving.save_future import OnFinished, SaveFuture
from ..errors import InvalidArgumentError, ShardkeepError
from .background_errors import BackgroundErrors
from .local_slices import Decision

logger = logging.getLogger("shardkeep")



@dataclasses.dataclass
class LocalSave:
    """One started save of a slice, until its end (which the manager's
    ``on_end`` records: ``shardkeep.manager.commits``)."""

    step: int
    folder: int          # the slice's process q: the save goes to p<q>
    name: str
    path: str
    started: float
    parts: list = dataclasses.field(repr=False)  # of _core.SavePart
    metadata: dict = dataclasses.field(repr=False)  # the save's custom metadata
    lease: Any = None    # the staging memory the save gives back (own slice only)
    future: SaveFuture | None = None  # set once the save is queued


def local_root(template, process_index: int) -> str:
    """``template`` with ``{process}`` replaced: this process's local root."""
    root = os.fspath(template)
    local = _core.Location(root.replace("{process}", str(process_index))).local_path
    if local is None:
        raise InvalidArgumentError(
            f"local_root must be a path on this host's own storage, got {root!r}")
    return local


class LocalTier:
    """The local tier of one manager (see the module docstring)."""

    def __init__(self, template, *, decider: save_decisions.Decider, keep_last: int,
                 options: options_lib.Options, width: int, job: str, reuse: bool = True,
                 clock: Callable[[], float] = time.time):
        self.me = jax.process_index()
        self.count = jax.process_count()
        self.root = local_root(template, self.me)
        self.decider = decider
        self.keep_last = keep_last
        self._options = options
        self._width = width
        # What every process calls this tier (its manager's root): names
        # its collective calls.
        self.job = job
        self._last_started: int | None = None
        self._last_started_time = policy_info.time_of_seconds(0)
        self._clock = clock
        self._reuse = reuse
        os.makedirs(self.root, exist_ok=True)
        # folder q -> {step: name} of committed slices; only this process
        # writes and deletes in its root, so the record stays true. The ends
        # of local saves change it on the save queue's thread (on_end).
        self._lock = threading.Lock()
        self.held: dict[int, dict[int, str]] = {}
        # (folder q, step) -> the slice's created_ns (its commit record's).
        self._created_ns: dict[tuple[int, int], int] = {}
        for q, listing in self._list().items():
            self.held[q] = {step: name for step, (name, _, _) in listing.items()}
            self._created_ns.update({(q, step): created for step, (_, _, created)
                                     in listing.items()})

    def slice_folder(self, q: int) -> str:
        """The folder of process q's slices in this process's root."""
        return os.path.join(self.root, _core.slice_folder_name(q))

    @property
    def timeout_s(self) -> float:
        return self._options.timeout_s

    # -- saving ----------------------------------------------------------

    def due(self, step: int, context: save_decisions.DecisionContext) -> bool:
        """Whether ``step`` gets a local save (asked at every step: see
        ``save_decisions.Decider``)."""
        own = self.held.get(self.me, {})
        previous = [policy_info.PolicyCheckpointInfo(s, None, policy_info.time_of_ns(
            self._created_ns.get((self.me, s), 0))) for s in sorted(own)]
        if self._last_started is not None and self._last_started not in own:
            previous.append(policy_info.PolicyCheckpointInfo(self._last_started, None,
                                                       self._last_started_time))
        now = policy_info.time_of_seconds(self._clock())
        due = self.decider.due(step, previous, context, now)
        return due and (self._last_started is None or step > self._last_started)

    def begin(self, step: int, items: Mapping[str, Any]) -> None:
        """Before a local save of ``step`` is staged: refuses the tier's
        reserved name, records the start and drops later steps of an
        earlier run."""
        if local_slices.SLICE_PART in items:
            raise InvalidArgumentError(
                f"checkpointable name {local_slices.SLICE_PART!r} is reserved by the local tier")
        self._last_started = step
        self._last_started_time = policy_info.time_of_seconds(self._clock())
        self._drop_from(step)

    def slices(self, step: int, parts: list, lease) -> list[LocalSave]:
        """The saves of ``step`` this process makes from its staged ``parts``
        (``lease``: their staging memory): its own slice and, in a job of
        several processes, the copy of its predecessor's slice, which the
        processes pass on around a ring (a collective call). The manager
        starts them; on failure the lease is given back here."""
        try:
            header, buffers = local_slices.describe(parts)
            saves = [self._slice(step, self.me, header, buffers, lease)]
            if self.count > 1:
                saves.append(self._peer_copy(step, header, buffers))
            return saves
        except BaseException:
            lease.give_back()
            raise

    def _peer_copy(self, step: int, header: local_slices.Description,
                   buffers: list) -> LocalSave:
        """Sends this slice to the successor; the save of the slice the
        predecessor sent."""
        pred, succ = (self.me - 1) % self.count, (self.me + 1) % self.count
        sent = dataclasses.replace(header, process=self.me, step=step)
        received = exchange.exchange_bytes(
            {succ: [sent.encoded(), *buffers]}, name=f"local save of {self.job}, step {step}",
            timeout_s=self._options.timeout_s)
        if pred not in received:
            raise ShardkeepError(
                f"local save of step {step}: process {pred} sent no copy of its slice")
        peer_header = local_slices.Description.decode(
            received[pred][0].tobytes(), f"the slice process {pred} sent at step {step}")
        if peer_header.step != step or peer_header.process != pred:
            raise ShardkeepError(
                f"local save of step {step}: process {pred} sent step"
                f" {peer_header.step} of process {peer_header.process}")
        return self._slice(step, pred, peer_header, received[pred][1:], None)

    def _slice(self, step: int, q: int, header: local_slices.Description, buffers: list,
               lease) -> LocalSave:
        name = _core.step_folder_name(step, self._width)
        folder = self.slice_folder(q)
        os.makedirs(folder, exist_ok=True)
        parts = local_slices.parts_of(header, buffers, q, self.count,
                                      compare_with=self._previous(q, step))
        return LocalSave(step, q, name, os.path.join(folder, name), time.monotonic(), parts,
                         {local_slices.LOCAL_MARK: {"process": q, "process_count": self.count}},
                         lease)

    def _previous(self, q: int, step: int) -> local_slices.Previous | None:
        """The newest committed slice q before ``step``, whose boxes a save
        of slice q links where their bytes are equal (None without reuse).

        The slices' bytes cross the exchange as plain buffers, so whether a
        box changed is found by comparing, not by array identity. Retention
        may delete it while the comparison runs: then the bytes are written.
        """
        earlier = [s for s in self.held.get(q, {}) if s < step and (q, s) in self._created_ns]
        if not self._reuse or not earlier:
            return None
        latest = max(earlier)
        return local_slices.Previous(os.path.join(self.slice_folder(q), self.held[q][latest]),
                                     self._created_ns[(q, latest)])

    def _drop_from(self, step: int) -> None:
        """Deletes the slices of ``step`` and later steps found in the root.

        They belong to a run that went further before it stopped (this run
        resumed from an earlier step): left there, slices of two runs at one
        step could together look like a complete step, and retention would
        keep them instead of this run's steps. Called with no local save in
        flight, so nothing else changes the record meanwhile.
        """
        core_options = self._options.to_core()
        for q, steps in self.held.items():
            for s in sorted(x for x in steps if x >= step):
                path = os.path.join(self.slice_folder(q), steps.pop(s))
                logger.info("deleting %s: a later step of an earlier run", path)
                _core.delete_checkpoint(path, core_options)

    def on_end(self, errors: BackgroundErrors, delete: Callable[[list[str]], None]
               ) -> Callable[[LocalSave], OnFinished]:
        """The ``on_finished`` of a slice's save, by its LocalSave: on the save
        queue's thread (``shardkeep.manager.commits``), it records the commit
        and passes the steps retention drops to ``delete``, or keeps the
        failure in ``errors``. Nothing raised there may escape."""

        def of(job: LocalSave) -> OnFinished:
            def finished(error: str | None, created_ns: int | None) -> bool:
                try:
                    if error is None:
                        logger.info("local step %d (slice %d) committed, %.2f s after its"
                                    " save started", job.step, job.folder,
                                    time.monotonic() - job.started)
                        with self._lock:
                            dropped = self.committed(job, created_ns)
                        delete(dropped)
                    else:
                        errors.failed_save(f"local save of step {job.step} to {job.path!r}"
                                           " failed", error, lambda: job.future)
                except Exception as e:  # noqa: BLE001 - raised on the next call
                    errors.record(f"recording the end of local step {job.step} failed", e)
                return error is not None
            return finished
        return of

    def steps(self) -> dict[int, list[int]]:
        """The committed local steps per slice folder: {process q: steps}."""
        with self._lock:
            return {q: sorted(steps) for q, steps in self.held.items() if steps}

    def committed(self, job: LocalSave, created_ns: int | None) -> list[str]:
        """Records a committed slice (``created_ns``: its commit record's);
        returns the paths retention drops.

        Retention keeps the newest ``keep_last`` steps of each folder this
        job writes. Folders it does not write (slices of a job with another
        process count) lose every step older than those kept.
        """
        steps = self.held.setdefault(job.folder, {})
        steps[job.step] = job.name
        if created_ns is not None:
            self._created_ns[(job.folder, job.step)] = created_ns
        dropped = [(job.folder, s) for s in sorted(steps)[:-self.keep_last]]
        oldest_kept = sorted(steps)[-self.keep_last:][0]
        written = {self.me, (self.me - 1) % self.count}
        for q, other in self.held.items():
            if q not in written:
                dropped += [(q, s) for s in other if s < oldest_kept]
        paths = []
        for q, s in dropped:
            paths.append(os.path.join(self.slice_folder(q), self.held[q].pop(s)))
            self._created_ns.pop((q, s), None)
        return paths

    # -- restoring -------------------------------------------------------

    def decide(self) -> Decision | None:
        """The newest step every slice of which some process holds (collective)."""
        listing = self._list()
        mine: dict[int, dict[int, int]] = {}  # step -> {slice q: process count}
        for q, steps in listing.items():
            for step, (_, count, _) in steps.items():
                mine.setdefault(step, {})[q] = count
        if self.count > 1:
            bridge = distributed.coordination()
            key = distributed.agree("local restore", self.job,
                                    self._options.timeout_s) + "/held"
            bridge.set(f"{key}/{self.me}", json.dumps(
                {str(s): {str(q): c for q, c in v.items()} for s, v in mine.items()}))
            everyone = {}
            for p in range(self.count):
                text = bridge.get(f"{key}/{p}", self._options.timeout_s)
                everyone[p] = {int(s): {int(q): c for q, c in v.items()}
                               for s, v in json.loads(text).items()}
        else:
            everyone = {0: mine}
        for step in sorted({s for held in everyone.values() for s in held}, reverse=True):
            counts = {c for held in everyone.values() for c in held.get(step, {}).values()}
            if len(counts) != 1:
                if len(counts) > 1:
                    logger.warning("local step %d is ignored: its slices disagree on the"
                                   " process count (%s)", step, sorted(counts))
                continue
            (count,) = counts
            holders = {q: sorted(p for p, held in everyone.items() if q in held.get(step, {}))
                       for q in range(count)}
            if all(holders.values()):
                paths = {q: os.path.join(self.slice_folder(q), listing[q][step][0])
                         for q in range(count) if self.me in holders[q]}
                return Decision(step, count, holders, paths)
        return None

    def _list(self) -> dict[int, dict[int, tuple[str, int, int]]]:
        """folder q -> {step: (name, process count, created_ns)} of committed
        slices; leftovers of unfinished saves are removed."""
        found: dict[int, dict[int, tuple[str, int, int]]] = {}
        core_options = self._options.to_core()
        if not os.path.isdir(self.root):  # wiped while this manager runs
            return found
        for folder_name in sorted(os.listdir(self.root)):
            q = _core.slice_of_folder(folder_name)
            folder = os.path.join(self.root, folder_name)
            if q is None or not os.path.isdir(folder):
                continue
            steps = found.setdefault(q, {})
            entries = _core.list_checkpoints(folder, core_options)
            leftovers.collect(folder, entries, self._options)
            for entry in entries:
                name = entry.name
                path = os.path.join(folder, name)
                step = _core.step_of_folder(name)
                commit = entry.commit
                if commit is None or step is None:
                    if entry.state is _core.EntryState.REJECTED:
                        logger.warning("%s is ignored: %s", path, entry.problem)
                    continue
                mark = commit.custom_metadata.get(local_slices.LOCAL_MARK) or {}
                count = mark.get("process_count")
                if mark.get("process") != q or not isinstance(count, int) or count <= q:
                    logger.warning("%s is ignored: it is not slice %d of a local save", path, q)
                    continue
                steps.setdefault(step, (name, count, commit.created_ns))
        return found
