"""Local-tier scenarios for multi-process jobs (see harness.py).

test_local_tier.py runs them as "local_tier_scenarios:<function>". The
state at step s is a function of s alone, so a restored step is checked
bit for bit against the state the job saved at that step.
"""

from __future__ import annotations

import os
import signal
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep.job import distributed
from job_arrays import job_array, job_mesh

PERSISTENT_INTERVAL = 4


def _mesh(rows: int) -> Mesh:
    return job_mesh(rows)


def _expected(step: int) -> dict:
    """The host values of the state at ``step``."""
    return {
        "w": np.arange(32 * 16, dtype=np.float32).reshape(32, 16) * 0.5 + step,
        "b": (np.arange(96, dtype=np.int32) * 7 + step),        # replicated
        "e": np.full((8, 24), step, dtype=np.float16) + np.arange(24, dtype=np.float16),
        "n": np.arange(5, dtype=np.int64) + step,               # a numpy leaf
    }


def _specs(variant: str) -> dict:
    if variant == "train":
        return {"w": P("data", "model"), "b": P(), "e": P(None, "model")}
    return {"w": P("model", None), "b": P("data"), "e": P()}   # another layout


def _state(step: int, mesh: Mesh) -> sk.Checkpointables:
    values = _expected(step)
    tree = {name: job_array(values[name], NamedSharding(mesh, spec))
            for name, spec in _specs("train").items()}
    tree["n"] = values["n"]
    return sk.Checkpointables(params=tree, data=sk.JsonValue({"next_step": step + 1}))


def _target(mesh: Mesh, variant: str) -> sk.Checkpointables:
    values = _expected(0)
    tree = {name: jax.ShapeDtypeStruct(values[name].shape, values[name].dtype,
                                       sharding=NamedSharding(mesh, spec))
            for name, spec in _specs(variant).items()}
    tree["n"] = np.zeros(5, np.int64)
    return sk.Checkpointables(params=tree, data=None)


def _exact(restored: dict, step: int) -> bool:
    expected = _expected(step)
    params = restored["params"]
    for name in ("w", "b", "e"):
        for shard in params[name].addressable_shards:
            if not np.array_equal(np.asarray(shard.data), expected[name][shard.index]):
                return False
    return (np.array_equal(params["n"], expected["n"])
            and restored["data"] == {"next_step": step + 1})


def _manager(root: str, local_root: str) -> sk.CheckpointManager:
    return sk.CheckpointManager(
        root, save_interval_steps=PERSISTENT_INTERVAL, keep_last=1,
        local_root=local_root, local_save_interval_steps=1, local_keep_last=2,
        options=sk.Options(timeout_s=60))


def train(root: str, local_root: str, last_step: int, kill_at: int | None = None,
          rows: int = 2, variant: str = "train") -> dict:
    """Restores (if anything is there), checks the restored step bit for
    bit, then trains up to ``last_step``, saving every step locally and every
    4th persistently; with ``kill_at`` the whole job kills itself with
    SIGKILL right after that step's save has returned."""
    mesh = _mesh(rows)
    mgr = _manager(root, local_root)
    started = time.monotonic()
    restored = mgr.restore(_target(mesh, variant))
    restore_s = time.monotonic() - started
    step, exact = 0, None
    if restored is not None:
        step, value = restored
        exact = _exact(value, step)
    blocking = {"local": [], "both": []}
    for s in range(step + 1, last_step + 1):
        state = _state(s, mesh)
        jax.block_until_ready(dict(state))
        t0 = time.monotonic()
        mgr.save(s, state)
        blocking["both" if s % PERSISTENT_INTERVAL == 0 else "local"].append(
            time.monotonic() - t0)
        if s == kill_at:
            distributed.coordination().barrier(f"test/kill-{s}", 60)
            if jax.process_index() == 0:
                time.sleep(1.0)  # the others die first: process 0 runs the service
            os.kill(os.getpid(), signal.SIGKILL)
    mgr.close()
    return {"restored": None if restored is None else step, "exact": exact,
            "restore_s": restore_s, "blocking": blocking,
            "local_steps": {str(q): s for q, s in mgr.local_steps().items()},
            "persistent_steps": mgr.all_steps()}


def restore_only(root: str, local_root: str, rows: int = 2, variant: str = "other") -> dict:
    """Restores onto a target of ``variant``'s layout and checks it; saves nothing."""
    mesh = _mesh(rows)
    with _manager(root, local_root) as mgr:
        started = time.monotonic()
        restored = mgr.restore(_target(mesh, variant))
        restore_s = time.monotonic() - started
    if restored is None:
        return {"restored": None}
    step, value = restored
    return {"restored": step, "exact": _exact(value, step), "restore_s": restore_s}
