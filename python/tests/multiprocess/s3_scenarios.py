"""Multi-process scenarios on s3:// paths (see harness.py); the server and
its credentials come from the environment the test sets."""

from __future__ import annotations

import jax

import shardkeep as sk
from scenarios import _options, check_state, make_state, mesh, targets


def save_and_verify(path: str, mesh_shape=(4, 2)) -> dict:
    """Saves the test state asynchronously from every process, then loads
    it back onto the same mesh and checks every local shard."""
    m = mesh(tuple(mesh_shape))
    sk.save_async(path, make_state(m), options=_options()).result()
    info = sk.metadata(path)
    return {"process": jax.process_index(),
            "leaves": len(info.checkpointables["state"].leaves),
            "checked": check_state(sk.load(path, targets(m)), targets(m))}
