"""Saving: the blocking phase in Python, the background phase in C++.

``save_async`` returns once every array's bytes are in host buffers the save
owns; the C++ writer then chunks, writes and commits on its own threads
(the commit protocol is described atop cpp/src/engine/save.cc).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Mapping

from .. import _core
from . import background_saves
from ..base import checkpointables, events, host_copy, unchanged
from ..job import distributed
from ..base import named_parts
from . import staging
from .. import options as options_lib
from . import save_base, staging_pool
from ..errors import InvalidArgumentError
from ..base.gc_pause import gc_paused
from .save_future import OnFinished, SaveFuture

def save(path, tree: Any, *, options: options_lib.Options | None = None,
         custom_metadata: Mapping | None = None, force: bool = False,
         step: int | None = None, base=None) -> None:
    """Saves ``tree`` as the checkpointable "state" and returns after the commit.

    A ``Checkpointables`` is saved as its named parts instead; any other
    value, a plain dict included, is the one tree "state" (see
    ``shardkeep.base.named_parts``).

    On the CPU backend arrays are written straight from their buffers, so
    they must not be donated from another thread while this runs.
    Raises AlreadyExistsError if a checkpoint exists at ``path`` and
    ``force`` is False, or if another job's save to ``path`` committed
    first (object stores); OutOfSpaceError when the storage fills up (the
    failed save leaves nothing behind); CommitStateUnknownError when the
    commit's outcome could not be settled (check ``path`` before retrying).
    ``force`` replaces a committed checkpoint: atomically on POSIX storage;
    on an object store the path holds no checkpoint for the moment between
    removing the old commit record and writing the new one (readers see
    the old checkpoint or the new one, never a mix).

    ``base`` names a committed checkpoint in the same storage (typically
    the previous one; ``path`` itself with ``force``). The arrays of
    ``tree`` that are the very ``jax.Array`` objects this process saved
    there, or loaded from there, hold the values stored there: they are
    neither copied to the host nor written, the new checkpoint links the
    base's data files instead (where the storage cannot link, their bytes
    are copied from the base). With ``Options(compare_with_base=True)``
    the other arrays are compared with the base's leaves of the same key
    path and linked where equal. The new checkpoint stands alone all the
    same: deleting the base deletes none of its data (docs/INCREMENTAL.md).
    """
    save_checkpointables(path, named_parts.to_save(tree), options=options,
                         custom_metadata=custom_metadata, force=force, step=step, base=base)


def save_async(path, tree: Any, *, options: options_lib.Options | None = None,
               custom_metadata: Mapping | None = None, force: bool = False,
               step: int | None = None, base=None) -> SaveFuture:
    """Saves ``tree`` as "state" (named parts for a ``Checkpointables``, as
    ``save``); returns after the blocking phase.

    When this returns the caller may donate, delete or overwrite the arrays
    of ``tree``: the save owns host copies of them. The future may be
    dropped: the save still finishes in the background, a failure is then
    logged, and interpreter exit waits for it.
    """
    return save_checkpointables_async(path, named_parts.to_save(tree), options=options,
                                      custom_metadata=custom_metadata, force=force, step=step,
                                      base=base)


def save_checkpointables(path, items: Mapping[str, Any], *,
                         options: options_lib.Options | None = None,
                         custom_metadata: Mapping | None = None,
                         metrics: Mapping | None = None, force: bool = False,
                         step: int | None = None, base=None) -> None:
    """Saves several checkpointables and returns after the commit.

    ``items`` maps checkpointable names to values; each value's kind is
    chosen by its type (see ``shardkeep.base.checkpointables``): ``bytes`` are
    saved as kind "bytes", ``JsonValue(obj)`` as kind "json", instances of
    a registered kind's class by that kind, anything else as a pytree.
    Each checkpointable can later be loaded alone.
    """
    path, options, start, _, staged, recorded = _prepare(
        path, items, options, custom_metadata, metrics, force, step, base, own_copies=False,
        asynchronous=False)
    # Queued like an async save (saves start in call order) and waited for
    # here: an error is raised, not logged. Ctrl-C cancels it (see
    # SaveFuture.result); the queue keeps it while its thread winds down.
    save = background_saves.start(start, path, options.timeout_s,
                                  on_finished=lambda error, _: recorded.ended(error))
    if staged.feed is not None:
        try:
            staged.feed()
        except BaseException:
            # The save ends committing nothing: its feeds failed, or it had
            # failed first and refused the shards. Its end is waited for
            # (and its error collected), so that nothing of it outlives
            # this call.
            try:
                SaveFuture(save).result()
            except Exception:
                pass
            raise
    _remember(path, staged.arrays, save)
    SaveFuture(save).result()


def save_checkpointables_async(path, items: Mapping[str, Any], *,
                               options: options_lib.Options | None = None,
                               custom_metadata: Mapping | None = None,
                               metrics: Mapping | None = None, force: bool = False,
                               step: int | None = None, base=None) -> SaveFuture:
    """``save_checkpointables`` that returns after the blocking phase.

    Errors found before staging (arguments, leaves) are raised here; those
    of starting the save in the core (e.g. AlreadyExistsError) by the
    future's ``result()``, or logged if it is never called.
    """
    return start_save(path, items, asynchronous=True, options=options,
                      custom_metadata=custom_metadata, metrics=metrics, force=force, step=step,
                      base=base)


def start_save(path, items: Mapping[str, Any], *, asynchronous: bool,
               options: options_lib.Options | None = None,
               custom_metadata: Mapping | None = None, metrics: Mapping | None = None,
               force: bool = False, step: int | None = None, base=None,
               on_finished: OnFinished | None = None) -> SaveFuture:
    """``save_checkpointables_async``, reported to ``jax.monitoring`` as a
    synchronous save unless ``asynchronous``; ``on_finished`` runs at the
    save's end (see ``OnFinished``), after its staging memory is back.

    A CheckpointManager with ``async_save=False`` starts its saves this way
    (its commit bookkeeping runs in ``on_finished`` alike) and waits for
    the commit before its ``save`` returns: the caller waited for the whole
    save, so it reports the synchronous events, whose blocking duration
    runs to the commit.
    """
    path, options, start, lease, staged, recorded = _prepare(
        path, items, options, custom_metadata, metrics, force, step, base, own_copies=True,
        asynchronous=asynchronous)
    assert lease is not None  # own_copies
    if asynchronous:
        recorded.blocking_done()

    def finished(error: str | None, created_ns: int | None) -> bool | None:
        # The buffer goes back at the save's end, before result() returns,
        # so a loop that waits for a save and at once starts the next
        # reuses it.
        lease.give_back()
        recorded.ended(error)
        return None if on_finished is None else on_finished(error, created_ns)
    save = background_saves.start(start, path, options.timeout_s, on_finished=finished)
    _remember(path, staged.arrays, save)
    return SaveFuture(save)


def _prepare(path, items, options, custom_metadata, metrics, force, step, base, *,
             own_copies: bool, asynchronous: bool):
    """The Python part of the blocking phase: validates, plans and stages.

    Returns the path, the resolved options, a function that starts the
    save in the core (returning its handle), with ``own_copies`` the lease
    of the staging memory the shards were copied into, the ``Staged``
    parts (without ``own_copies``, pytree parts may be fed once the save
    has started: ``Staged.feed``), and the save's events (of an async save
    or a sync one), started here.
    """
    path = os.fspath(path)
    recorded = events.SaveEvents(path, asynchronous=asynchronous)
    try:
        recorded.nbytes = events.tree_bytes(items)
        return (*_stage_save(path, items, options, custom_metadata, metrics, force, step,
                                   base, own_copies=own_copies), recorded)
    except BaseException as e:
        recorded.ended(str(e) or type(e).__name__)
        raise


def _stage_save(path: str, items, options, custom_metadata, metrics, force, step, base,
                      *, own_copies: bool):
    options = options_lib.resolve(options)
    if not isinstance(items, Mapping) or not items:
        raise InvalidArgumentError("checkpointables must be a non-empty mapping of name to value")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise InvalidArgumentError(f"step must be a non-negative int or None, got {step!r}")
    custom_metadata_json = _json_object("custom_metadata", custom_metadata)
    metrics_json = _json_object("metrics", metrics)
    # In a multi-process job every process calls this with the same
    # arguments; the coordinator runs the commit protocol across them.
    coordinator = distributed.coordinator()
    # A synchronous save streams: its writers start while it is staged.
    staged, lease = stage_parts(items, options, save_base.base_of(base, options),
                                own_copies=own_copies, feeds=not own_copies)
    start = _starter(path, staged.parts, step=step, custom_metadata_json=custom_metadata_json,
                     metrics_json=metrics_json, force=force, options=options,
                     coordinator=coordinator)
    return path, options, start, lease, staged


def _remember(path: str, arrays: dict[str, list], save: _core.QueuedSave) -> None:
    """Notes where ``save`` puts the arrays it saves (``base.unchanged``)."""
    for name, named in arrays.items():
        unchanged.note_saved(named, path, name, save)


@dataclasses.dataclass
class Staged:
    """The ``_core.start_save`` parts of a save, staged (``stage_parts``)."""

    parts: list[_core.SavePart]
    # Per pytree part, the arrays whose places are remembered once the save
    # is known (``shardkeep.base.unchanged``).
    arrays: dict[str, list[tuple[str, Any]]]
    # With feeds: stages the fed parts' shards into their feeds, once the
    # save has started (see ``stage_parts``).
    feed: Callable[[], None] | None = None


def stage_parts(items: Mapping[str, Any], options: options_lib.Options,
                base: save_base.Base | None = None, *, own_copies: bool, feeds: bool = False
                ) -> tuple[Staged, staging_pool.Lease | None]:
    """The ``_core.start_save`` parts of ``items``: this process's shards
    (the boxes it writes in a save of the whole job), staged; the arrays
    stored in ``base`` as they are are named, not staged.

    With ``own_copies``, the shards that alias the caller's memory are
    copied into one staging buffer (see ``shardkeep.saving.staging_pool``),
    whose lease is returned: the caller may then donate, delete or
    overwrite its arrays. The copies run on native threads while the rest
    is staged (the buffer is sized from the plans first). Without, those
    shards must be written before the arrays change.

    With ``feeds`` (and no ``base``, whose links the core plans from all
    shards at once), each pytree part only gets its meta.json and a
    ``_core.ShardFeed`` here; ``Staged.feed``, called once the save has
    started, stages the shards into the feeds while the save's writers
    write the first ones.
    """
    staged = Staged([], {})
    # Thousands of small objects: no collection in the blocking phase.
    with gc_paused():
        parts = _planned_parts(items, options)
        lease = copies = None
        if own_copies:
            lease = staging_pool.lease(_staging_bytes(parts), reuse=options.reuse_staging_memory)
            copies = _core.StagingCopies(lease.buffer, host_copy.copy_thread_count())
        fed: list[tuple[str, _core.ShardFeed, Callable[[], staging.StagedTree]]] = []
        try:
            for name, part, planned in parts:
                if planned is None:
                    staged.parts.append(checkpointables.value_part(name, part))
                    continue
                if feeds and base is None:
                    feed = _core.ShardFeed(name)
                    meta_json = staging.meta_json_of(planned, part.registered_kind)
                    staged.parts.append(_core.SavePart(name, "pytree", meta_json, feed=feed))
                    fed.append((name, feed, functools.partial(
                        staging.stage_pytree, part.value,
                        replica_parallel=options.replica_parallel,
                        registered_kind=part.registered_kind, checkpointable=name,
                        planned=planned, feed=feed,
                        pinned_host=options.pinned_host_staging)))
                    continue
                tree = staging.stage_pytree(
                    part.value, replica_parallel=options.replica_parallel,
                    registered_kind=part.registered_kind, base=base, checkpointable=name,
                    planned=planned, copies=copies, pinned_host=options.pinned_host_staging)
                staged.parts.append(_core.SavePart(name, "pytree", tree.meta_json,
                                                   shards=tree.shards))
                staged.arrays[name] = tree.arrays
        except BaseException:
            if copies is not None and lease is not None:
                # The copies under way read the caller's arrays and write
                # the buffer, which goes back only after them.
                copies.finish()
                lease.give_back()
            raise
        if copies is not None:
            copies.finish()
        if fed:
            staged.feed = functools.partial(_feed_parts, fed, staged.arrays)
        return staged, lease


def _feed_parts(fed: list[tuple[str, _core.ShardFeed, Callable[[], staging.StagedTree]]],
                arrays: dict[str, list[tuple[str, Any]]]) -> None:
    """Stages each fed part into its feed and closes it (``stage_parts``).
    On any failure every feed fails, so the save commits nothing, and the
    failure is raised."""
    staging_now = ""
    try:
        with gc_paused():
            for name, feed, stage in fed:
                staging_now = name
                arrays[name] = stage().arrays
                feed.close()
    except BaseException as e:
        for _, feed, _ in fed:
            feed.fail(f"staging the shards of {staging_now!r} failed: "
                      f"{type(e).__name__}: {e}")
        raise


def prepare_staging(items: Mapping[str, Any], options: options_lib.Options) -> None:
    """Starts making the staging memory an async save of ``items`` would
    copy into ready in the background (``staging_pool.prepare``), so that
    the first async save of the process need not touch fresh memory. No
    effect without ``reuse_staging_memory``."""
    if options.reuse_staging_memory:
        with gc_paused():
            staging_pool.prepare(_staging_bytes(_planned_parts(items, options)))


def _planned_parts(items: Mapping[str, Any], options: options_lib.Options) -> list[tuple]:
    """(name, classified part, plan or None) of each checkpointable."""
    parts = []
    for name, value in items.items():
        checkpointables.check_name(name)
        part = checkpointables.classify(value)
        planned = (staging.plan_pytree(part.value, options.replica_parallel)
                   if part.kind == "pytree" else None)
        parts.append((name, part, planned))
    return parts


def _staging_bytes(parts: list[tuple]) -> int:
    """The staging buffer an async save of ``parts`` copies into."""
    return staging_pool.bytes_needed(n for _, _, planned in parts if planned is not None
                                     for n in staging.aliased_sizes(planned))


def start_single_process_async(path, parts: list[_core.SavePart], *, options: options_lib.Options,
                               step: int | None = None,
                               custom_metadata: Mapping | None = None, force: bool = False,
                               lease: staging_pool.Lease | None = None,
                               on_finished: OnFinished | None = None) -> SaveFuture:
    """Starts a save of ``parts`` by this process alone, as a one-process
    checkpoint (no coordinator), whatever the job's process count; the
    parts must describe whole leaves (the core checks that they tile).
    ``lease``, if any, is given back once the save has finished, before
    ``on_finished`` (see ``OnFinished``) runs."""
    path = os.fspath(path)
    start = _starter(path, parts, step=step,
                     custom_metadata_json=_json_object("custom_metadata", custom_metadata),
                     metrics_json="{}", force=force, options=options, coordinator=None)

    def finished(error: str | None, created_ns: int | None) -> bool | None:
        if lease is not None:
            lease.give_back()
        return None if on_finished is None else on_finished(error, created_ns)
    save = background_saves.start(start, path, options.timeout_s, on_finished=finished)
    return SaveFuture(save)


def _starter(path: str, parts: list[_core.SavePart], *, step: int | None,
             custom_metadata_json: str, metrics_json: str, force: bool,
             options: options_lib.Options, coordinator: _core.Coordinator | None
             ) -> Callable[[], _core.SaveHandle]:
    """A function that starts the save in the core and returns its handle.

    In a job, it first agrees with the other processes on the save's id
    (``distributed.agree``, by the path): a save that some processes do not
    make fails there, naming them, and leaves the job's later saves intact.
    A one-process save's coordinator is its own, so any id serves.
    """
    core_options = options.to_core()

    def start() -> _core.SaveHandle:
        operation_id = ("local" if coordinator is None
                        else distributed.agree("save", path, options.timeout_s))
        return _core.start_save(
            path, parts, step=step, custom_metadata_json=custom_metadata_json,
            metrics_json=metrics_json, force=force, options=core_options,
            coordinator=coordinator, operation_id=operation_id)

    return start


def _json_object(what: str, value: Mapping | None) -> str:
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} must be a mapping, got {type(value).__name__}")
    try:
        return json.dumps(dict(value), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what} is not JSON-serialisable: {e}") from e
