"""Saves and loads reported through ``jax.monitoring``, under Orbax's event names.

Goodput tooling and trainers listen to ``jax.monitoring`` for Orbax's
events; shardkeep records the same names, so their dashboards keep working
after a switch (docs/MANAGER.md, "Events", lists them all). As in Orbax,
the process with index 0 records the starts, durations and successes, and
every process records the storage type. What Orbax has no name for
(failures) is recorded under ``/jax/shardkeep/...``.

The names, kinds and keyword arguments are those Orbax's CheckpointManager
records (its ``OperationRecorder`` and async checkpointer). A save's
blocking duration is what the caller waited for: for an async save the
device-to-host copy and staging, after which its background duration runs
to the commit; for a synchronous one (``shardkeep.save``, a manager with
``async_save=False``) the whole save, to the commit. The total runs from
the call to the commit.

Each save and load also reports its size and throughput as Orbax's
handlers do (on the primary process, without a storage type): a save's
``/jax/orbax/write/blocking_gbytes_per_sec`` when its caller stops
waiting, ``/jax/orbax/write/gbytes`` and ``.../gbytes_per_sec`` at its
commit; a load's ``/jax/checkpoint/read/gbytes`` and ``.../gbytes_per_sec``.
The size is that of the tree (``tree_bytes``): each array's global size,
whatever share of it this process wrote or read, in GiB (2**30 bytes, as
Orbax divides), over the seconds from the call.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any, Iterator

import jax
import numpy as np

from .. import _core
from . import tree_codec
from ..errors import InvalidArgumentError

SAVE_FAILURE = "/jax/shardkeep/write/failure"
LOAD_FAILURE = "/jax/shardkeep/read/failure"


def storage_type(path: str) -> str:
    """The scheme of ``path``'s ``_core.Location``: "file", "s3", "memory", ...;
    "unknown" for a URL no backend reads (the call on it fails, and
    records that it did)."""
    try:
        return _core.Location(path).scheme
    except InvalidArgumentError:
        return "unknown"


def _primary() -> bool:
    return jax.process_index() == 0


def tree_bytes(tree: Any) -> int:
    """The bytes of a saved or loaded tree, as Orbax counts them: each
    array's global size (``nbytes``, or its shape times its item size for
    an array-like such as ``shardkeep.ArraySource``), and the length of
    bytes and strings; Python scalars and None count nothing."""
    total = 0
    for leaf in _leaves(tree):
        if isinstance(leaf, (jax.Array, np.ndarray)):  # their nbytes is Python work per leaf
            total += math.prod(leaf.shape) * leaf.dtype.itemsize
        elif hasattr(leaf, "nbytes"):
            total += int(leaf.nbytes)
        elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            total += math.prod(leaf.shape) * int(getattr(leaf.dtype, "itemsize", 1))
        elif isinstance(leaf, (bytes, str)):
            total += len(leaf.encode() if isinstance(leaf, str) else leaf)
    return total


def _leaves(tree: Any) -> list:
    """JAX's leaves of ``tree``, or, for a tree JAX cannot flatten (a dict
    whose keys do not sort, such as 7 and "params", which shardkeep saves
    in their order), shardkeep's own; none for a tree shardkeep refuses
    too, whose save then fails with the staging's error, not this count's."""
    try:
        return jax.tree.leaves(tree)
    except (TypeError, ValueError):
        pass
    try:
        return [leaf.value for leaf in tree_codec.flatten(tree)[1]]
    except InvalidArgumentError:
        return []


def _throughput(per_second: str, total: str | None, nbytes: int, seconds: float) -> None:
    """Orbax's size scalars: GiB per second (NaN for no time) and GiB."""
    gib = nbytes / 2**30
    jax.monitoring.record_scalar(per_second, gib / seconds if seconds > 0 else math.nan)
    if total is not None:
        jax.monitoring.record_scalar(total, gib)


class SaveEvents:
    """The events of one save, from its start (the object's creation)."""

    def __init__(self, path: str, *, asynchronous: bool):
        self.nbytes: int | None = None  # the tree's, once known (``tree_bytes``)
        self._storage = storage_type(path)
        self._async = asynchronous
        self._started = time.monotonic()
        self._blocking_s: float | None = None
        self._lock = threading.Lock()
        kind = "async/" if asynchronous else ""
        if _primary():
            jax.monitoring.record_event(f"/jax/orbax/write/{kind}start")
            jax.monitoring.record_scalar(f"/jax/orbax/write/{kind}start_time",
                                         time.time() * 1000.0, storage_type=self._storage)
        jax.monitoring.record_event("/jax/orbax/write/storage_type",
                                    storage_type=self._storage)

    def blocking_done(self) -> None:
        """An async save's caller stops waiting; the save goes on behind."""
        assert self._async, "a synchronous save's caller waits for the commit"
        with self._lock:
            self._blocking_s = time.monotonic() - self._started
            blocking = self._blocking_s
        if not _primary():
            return
        self._blocking_throughput(blocking)
        jax.monitoring.record_event_duration_secs(
            "/jax/checkpoint/write/async/blocking_duration_secs", blocking)
        jax.monitoring.record_event_duration_secs(
            "/jax/orbax/write/async/blocking_duration_secs", blocking,
            storage_type=self._storage)
        jax.monitoring.record_scalar("/jax/orbax/write/async/blocking_end_time",
                                     time.time() * 1000.0, storage_type=self._storage)

    def ended(self, error: str | None) -> None:
        """The save committed (``error`` None) or failed."""
        total = time.monotonic() - self._started
        with self._lock:
            blocking = self._blocking_s
        if error is not None:
            if _primary():
                jax.monitoring.record_event(SAVE_FAILURE, storage_type=self._storage)
            return
        if self.nbytes is not None and _primary():
            _throughput("/jax/orbax/write/gbytes_per_sec", "/jax/orbax/write/gbytes",
                        self.nbytes, total)
        if not self._async:
            self._sync_ended(total)
            return
        if _primary():
            jax.monitoring.record_event("/jax/orbax/write/success")
            jax.monitoring.record_event_duration_secs(
                "/jax/checkpoint/write/async/total_duration_secs", total,
                storage_type=self._storage)
            jax.monitoring.record_event_duration_secs(
                "/jax/orbax/write/async/total_duration_secs", total,
                storage_type=self._storage)
        assert blocking is not None  # start_save reports it before the save starts
        # As Orbax's background thread records it: on every process, no storage type.
        jax.monitoring.record_event_duration_secs(
            "/jax/orbax/write/background_duration_secs", total - blocking)

    def _sync_ended(self, total: float) -> None:
        """A synchronous save committed: the caller waited for all of it."""
        if not _primary():
            return
        self._blocking_throughput(total)
        jax.monitoring.record_event_duration_secs(
            "/jax/orbax/write/blocking_duration_secs", total, storage_type=self._storage)
        jax.monitoring.record_scalar("/jax/orbax/write/blocking_end_time",
                                     time.time() * 1000.0, storage_type=self._storage)
        jax.monitoring.record_event("/jax/orbax/write/success")
        jax.monitoring.record_event_duration_secs(
            "/jax/orbax/write/total_duration_secs", total, storage_type=self._storage)


    def _blocking_throughput(self, blocking: float) -> None:
        if self.nbytes is not None:
            _throughput("/jax/orbax/write/blocking_gbytes_per_sec", None, self.nbytes, blocking)


class LoadReport:
    """What the body of ``loading`` tells it: the value it loaded."""

    def __init__(self):
        self.nbytes: int | None = None

    def loaded(self, value: Any) -> Any:
        """Notes the loaded ``value`` (its ``tree_bytes``); returns it."""
        self.nbytes = tree_bytes(value)
        return value


@contextlib.contextmanager
def loading(path) -> Iterator[LoadReport]:
    """The events of a load that runs in the ``with`` body, which gives
    the report the value it loaded (for the size scalars)."""
    storage = storage_type(str(path))
    started = time.monotonic()
    if _primary():
        jax.monitoring.record_event("/jax/orbax/read/start")
    jax.monitoring.record_event("/jax/orbax/read/storage_type", storage_type=storage)
    report = LoadReport()
    try:
        yield report
    except BaseException:
        if _primary():
            jax.monitoring.record_event(LOAD_FAILURE, storage_type=storage)
        raise
    if _primary():
        total = time.monotonic() - started
        jax.monitoring.record_event("/jax/orbax/read/success")
        jax.monitoring.record_event_duration_secs("/jax/orbax/read/blocking_duration_secs",
                                                  total, storage_type=storage)
        jax.monitoring.record_event_duration_secs("/jax/orbax/read/total_duration_secs",
                                                  total, storage_type=storage)
        if report.nbytes is not None:
            _throughput("/jax/checkpoint/read/gbytes_per_sec", "/jax/checkpoint/read/gbytes",
                        report.nbytes, total)
