"""Copying the shards that alias the caller's memory into a leased staging
buffer while the rest of a save is staged."""

from __future__ import annotations

import numpy as np

from .. import _core
from ..base import host_copy
from . import staging_pool


class StreamedCopies:
    """Copies aliased shards into one leased staging buffer on native
    threads (``_core.BackgroundCopy``, which never takes the GIL) while the
    training thread stages the next shards; ``finish`` waits and points
    each shard at its copy.

    Shards and copies are kept in two lists, not as pairs: thousands of
    new tuples would leave the collector's count high (freed tuples go to
    a free list without counting down) and set off a collection as the
    caller's pause ends."""

    def __init__(self, lease: staging_pool.Lease):
        self.lease = lease
        self._copier = _core.BackgroundCopy(host_copy.copy_thread_count())
        self._shards: list[_core.Shard] = []
        self._copies: list[np.ndarray] = []  # kept alive until finish

    def add(self, shard: _core.Shard) -> None:
        source = _host_array(shard)  # the shard keeps it alive until finish
        copy = self.lease.carve(source.nbytes)
        self._shards.append(shard)
        self._copies.append(copy)
        self._copier.add(source, copy)

    def finish(self) -> None:
        self._copier.finish()
        for shard, copy in zip(self._shards, self._copies):
            shard.data = copy

    def abandon(self) -> None:
        """After a failure: waits for the copies under way (they read the
        caller's arrays and write the buffer), then gives the buffer back."""
        self._copier.finish()
        self.lease.give_back()


def _host_array(shard: _core.Shard) -> np.ndarray:
    """An aliased shard's data, which staging makes a host array, never a
    fill function (``staging.StagedTree``)."""
    if not isinstance(shard.data, np.ndarray):
        raise TypeError(f"an aliased shard holds a {type(shard.data).__name__}, not an array")
    return shard.data
