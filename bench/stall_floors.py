"""W6's floors: what a snapshot of the state that stays correct under
donation costs at the least on the CPU backend.

  memcpy_touched  W1's state: one copy of every shard's bytes (its host
                  view; on the CPU backend np.asarray of a shard is a view
                  of its buffer) into memory already touched. The copy is
                  done once untimed, so the destination's pages are mapped,
                  and the second copy is timed.
  d2h             W2's 2,000 leaves: copy_to_host_async on every leaf,
                  then each leaf's np.asarray copied into a touched
                  destination; the Python work per leaf is included, as a
                  tool pays it too. The untimed first pass runs on a second,
                  identical state, since a jax.Array keeps its host value
                  once asked for it.
"""

from __future__ import annotations

import time

import numpy as np

import workloads

OPS = {"memcpy_touched": "W1", "d2h": "W2"}


def run(op: str, scale: str, reset_peak_rss) -> dict:
    import jax
    workload = OPS[op]
    result = {"state": workload, "bytes": workloads.state_bytes(workload, scale)}
    if op == "memcpy_touched":
        views = _shard_views(jax.block_until_ready(workloads.jax_state(workload, scale)))
        destination = np.empty(sum(v.nbytes for v in views), np.uint8)
        _copy_views(views, destination)
        reset_peak_rss()
        start = time.perf_counter()
        _copy_views(views, destination)
    else:
        first, timed = (jax.block_until_ready(workloads.jax_state(workload, scale))
                        for _ in range(2))
        destination = np.empty(result["bytes"], np.uint8)
        _copy_to_host(jax.tree.leaves(first), destination)
        reset_peak_rss()
        start = time.perf_counter()
        _copy_to_host(jax.tree.leaves(timed), destination)
    result["seconds"] = time.perf_counter() - start
    return result


def _shard_views(state) -> list[np.ndarray]:
    """Host views of every shard held once (replicas skipped)."""
    import jax
    return [np.asarray(shard.data) for leaf in jax.tree.leaves(state)
            for shard in leaf.addressable_shards if shard.replica_id == 0]


def _copy_views(views, destination) -> None:
    offset = 0
    for view in views:
        np.copyto(destination[offset:offset + view.nbytes].view(view.dtype).reshape(view.shape),
                  view)
        offset += view.nbytes


def _copy_to_host(leaves, destination) -> None:
    for leaf in leaves:
        leaf.copy_to_host_async()
    offset = 0
    for leaf in leaves:
        host = np.asarray(leaf)
        np.copyto(destination[offset:offset + host.nbytes].view(host.dtype).reshape(host.shape),
                  host)
        offset += host.nbytes
