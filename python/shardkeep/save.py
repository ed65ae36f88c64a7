"""Saving: the blocking phase in Python, the background phase in C++.

``save_async`` returns once every array's bytes are in host buffers the save
owns; the C++ writer then chunks, writes and commits on its own threads.
See DESIGN.md §5.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Mapping

from . import _core, checkpointables, distributed, staging
from . import options as options_lib
from .errors import InvalidArgumentError, TimeoutError
from .gc_pause import gc_paused

# Numbers this process's save calls. Every process of a job makes the same
# calls in the same order, so the n-th save's barrier keys agree everywhere;
# a call counts even when it fails before reaching the engine on this
# process only, so the processes stay in step afterwards.
_save_calls = itertools.count()


class SaveFuture:
    """The outcome of a save whose background phase may still be running."""

    def __init__(self, handle, path: str):
        self._handle = handle
        self._path = path

    def result(self, timeout: float | None = None) -> None:
        """Waits until the checkpoint is committed.

        Raises the save's error if it failed, and shardkeep.TimeoutError if
        it is not committed within ``timeout`` seconds (None waits; the core
        bounds every wait by Options.timeout_s).
        """
        if not self._handle.wait(timeout):
            raise TimeoutError(
                f"save to {self._path!r} not committed within {timeout} s; it continues in the"
                " background, call result() again to keep waiting")

    def done(self) -> bool:
        """True once the save has committed or failed."""
        return self._handle.done()

    @property
    def path(self) -> str:
        """The checkpoint path being written."""
        return self._path


def save(path, tree: Any, *, options: options_lib.Options | None = None,
         custom_metadata: Mapping | None = None, force: bool = False,
         step: int | None = None) -> None:
    """Saves ``tree`` as the checkpointable "state" and returns after the commit.

    On the CPU backend arrays are written straight from their buffers, so
    they must not be donated from another thread while this runs.
    Raises AlreadyExistsError if a checkpoint exists at ``path`` and
    ``force`` is False; OutOfSpaceError when the storage fills up (the
    failed save leaves nothing behind); CommitStateUnknownError when the
    commit's outcome could not be settled (check ``path`` before retrying).
    """
    save_checkpointables(path, {"state": tree}, options=options,
                         custom_metadata=custom_metadata, force=force, step=step)


def save_async(path, tree: Any, *, options: options_lib.Options | None = None,
               custom_metadata: Mapping | None = None, force: bool = False,
               step: int | None = None) -> SaveFuture:
    """Saves ``tree`` as "state"; returns after the blocking phase.

    When this returns the caller may donate, delete or overwrite the arrays
    of ``tree``: the save owns host copies of them.
    """
    return save_checkpointables_async(path, {"state": tree}, options=options,
                                      custom_metadata=custom_metadata, force=force, step=step)


def save_checkpointables(path, items: Mapping[str, Any], *,
                         options: options_lib.Options | None = None,
                         custom_metadata: Mapping | None = None,
                         metrics: Mapping | None = None, force: bool = False,
                         step: int | None = None) -> None:
    """Saves several checkpointables and returns after the commit.

    ``items`` maps checkpointable names to values; each value's kind is
    chosen by its type (see ``shardkeep.checkpointables``): ``bytes`` are
    saved as kind "bytes", ``JsonValue(obj)`` as kind "json", instances of
    a registered kind's class by that kind, anything else as a pytree.
    Each checkpointable can later be loaded alone.
    """
    _start(path, items, options, custom_metadata, metrics, force, step,
           own_copies=False).result()


def save_checkpointables_async(path, items: Mapping[str, Any], *,
                               options: options_lib.Options | None = None,
                               custom_metadata: Mapping | None = None,
                               metrics: Mapping | None = None, force: bool = False,
                               step: int | None = None) -> SaveFuture:
    """``save_checkpointables`` that returns after the blocking phase."""
    return _start(path, items, options, custom_metadata, metrics, force, step,
                  own_copies=True)


def _start(path, items, options, custom_metadata, metrics, force, step, *,
           own_copies: bool) -> SaveFuture:
    operation_id = str(next(_save_calls))
    path = os.fspath(path)
    options = options_lib.resolve(options)
    if not isinstance(items, Mapping) or not items:
        raise InvalidArgumentError("checkpointables must be a non-empty mapping of name to value")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise InvalidArgumentError(f"step must be a non-negative int or None, got {step!r}")
    # In a multi-process job every process calls this with the same
    # arguments; the coordinator runs the commit protocol across them.
    coordinator = distributed.coordinator()
    with staging.planning(replica_parallel=options.replica_parallel), gc_paused():
        parts = [checkpointables.encode(name, value, own_copies=own_copies)
                 for name, value in items.items()]
    handle = _core.start_save(
        path, parts, step=step,
        custom_metadata_json=_json_object("custom_metadata", custom_metadata),
        metrics_json=_json_object("metrics", metrics),
        force=force, options=options.to_core(), coordinator=coordinator,
        operation_id=operation_id)
    return SaveFuture(handle, path)


def _json_object(what: str, value: Mapping | None) -> str:
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} must be a mapping, got {type(value).__name__}")
    try:
        return json.dumps(dict(value), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what} is not JSON-serialisable: {e}") from e
