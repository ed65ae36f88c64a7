"""Which arrays an earlier checkpoint already holds, so that a save can take
their chunks from there instead of writing them again.

A ``jax.Array`` never changes: while the same object lives (not deleted,
not donated), its values are those it had when it was saved, or when it
was loaded. So this process remembers, for each array it saved or loaded,
where that left it: the checkpoint, the checkpointable, the leaf's key path
and the checkpoint's ``created_ns`` (a checkpoint later replaced at the
same path has another). A save with a base checkpoint asks ``stored_in``
about its array leaves: an array known to be in the base, as it is now, is
passed to the core as a ``_core.StoredIn``, which links the base's data
files (or reads them where the storage cannot link): no device-to-host
copy, no write.

Nothing is kept alive for this: the arrays are held by weak references,
and a save's record counts only once the core says that save committed.
numpy arrays are never remembered (they can be written in place).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import weakref
from typing import Any

import jax
import numpy as np

from .. import _core

# A few places per array: its latest saves and the load it came from.
_MAX_PLACES = 4
# Arrays smaller than this are written again: remembering an array costs
# about a microsecond per save, and a tree of thousands of small leaves
# (norm scales, biases, counters) would pay milliseconds of its training
# stall to save the writing of a few kilobytes each.
MIN_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class _Place:
    """Where an array was saved or loaded. ``created_ns`` is the
    checkpoint's, or None while the save is not known to have committed
    (then ``save`` tells, once it has)."""

    checkpoint: str
    checkpointable: str
    leaf_path: str
    created_ns: int | None = None
    save: Any = None  # the _core.QueuedSave that writes it

    def committed_ns(self) -> int | None:
        if self.created_ns is not None:
            return self.created_ns
        return None if self.save is None else self.save.committed_created_ns


class _Places:
    """id(array) -> (a weak reference to it, its places, newest last)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_id: dict[int, tuple[weakref.ref, list[_Place]]] = {}

    def note(self, array: jax.Array, place: _Place) -> None:
        key = id(array)
        with self._lock:
            entry = self._by_id.get(key)
            if entry is None or entry[0]() is not array:
                entry = (weakref.ref(array, self._forget(key)), [])
                self._by_id[key] = entry
            places = entry[1]
            places.append(place)
            del places[:-_MAX_PLACES]

    def of(self, array: jax.Array) -> list[_Place]:
        with self._lock:
            entry = self._by_id.get(id(array))
            if entry is None or entry[0]() is not array:
                return []
            return list(entry[1])

    def _forget(self, key: int):
        def forget(ref: weakref.ref) -> None:
            with self._lock:
                entry = self._by_id.get(key)
                if entry is not None and entry[0] is ref:
                    del self._by_id[key]
        return forget


_places = _Places()


def checkpoint_key(path) -> str:
    """``path`` as places are compared: the core's canonical key, one for
    every spelling of a checkpoint (``_core.Location``)."""
    return _core.Location(os.fspath(path)).key


def worth_remembering(value: Any) -> bool:
    """Whether the places of ``value`` are remembered: a ``jax.Array`` of
    at least ``MIN_BYTES`` (its shape and dtype decide, so a save plan can
    ask once)."""
    return isinstance(value, jax.Array) and worth_comparing(value)


def worth_comparing(value: Any) -> bool:
    """Whether a save with ``Options.compare_with_base`` (or the local
    tier) compares ``value`` with the base: a ``jax.Array`` or numpy array
    of at least ``MIN_BYTES``."""
    # From the shape and dtype: jax.Array.nbytes is Python work per call,
    # and a tree's first save asks this of thousands of leaves.
    return (isinstance(value, (jax.Array, np.ndarray))
            and math.prod(value.shape) * value.dtype.itemsize >= MIN_BYTES)


def note_saved(arrays: list[tuple[str, jax.Array]], checkpoint: str, checkpointable: str,
               save: Any) -> None:
    """Remembers that ``save`` (a ``_core.QueuedSave``) writes each
    (key path, array) of ``arrays`` into ``checkpoint``; it counts once
    that save has committed."""
    checkpoint = checkpoint_key(checkpoint)
    for path, array in arrays:
        _places.note(array, _Place(checkpoint, checkpointable, path, save=save))


@dataclasses.dataclass(frozen=True)
class Origin:
    """A pytree checkpointable of a committed checkpoint, as loads name the
    place their arrays came from."""

    checkpoint: str
    checkpointable: str
    created_ns: int


def note_loaded(array: jax.Array, origin: Origin, leaf_path: str) -> None:
    """Remembers that ``array`` holds leaf ``leaf_path`` of ``origin`` as
    stored there (loaded without a cast)."""
    _places.note(array, _Place(checkpoint_key(origin.checkpoint), origin.checkpointable,
                               leaf_path, created_ns=origin.created_ns))


def stored_in(values: dict[int, Any], base: str, base_created_ns: int
              ) -> dict[int, _core.StoredIn]:
    """Where in the checkpoint ``base`` (created at ``base_created_ns``) each
    array of ``values`` (by any key) is stored, for those known to be there."""
    base = checkpoint_key(base)
    found: dict[int, _core.StoredIn] = {}
    for key, value in values.items():
        if not isinstance(value, jax.Array) or value.is_deleted():
            continue
        for place in reversed(_places.of(value)):
            if place.checkpoint == base and place.committed_ns() == base_created_ns:
                found[key] = _core.StoredIn(base, place.checkpointable, place.leaf_path,
                                            base_created_ns)
                break
    return found
