"""CheckpointManager scenarios for multi-process jobs (see harness.py).

test_manager.py runs them as "manager_scenarios:<function>".
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
from job_arrays import job_array, job_mesh

LOSSES = {2: 5.0, 4: 1.0, 5: 4.0, 6: 3.0, 8: 6.0, 10: 7.0}
SHAPE = (16, 8)


def _mesh() -> Mesh:
    return job_mesh(2)


def _expected(step: int) -> np.ndarray:
    return np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) + step


def _state(step: int, mesh: Mesh) -> dict:
    value = _expected(step)
    w = job_array(value, NamedSharding(mesh, P("data", "model")))
    return sk.Checkpointables(params={"w": w}, data=sk.JsonValue({"next_step": step}))


def manager_job(root: str) -> dict:
    """Saves on a schedule with retention, reopens, loads, then is preempted."""
    mesh = _mesh()
    policy = dict(save_interval_steps=2, keep_last=2, keep_best=1, best_metric="loss")
    with sk.CheckpointManager(root, **policy) as mgr:
        saved = [step for step in range(1, 11)
                 if mgr.save(step, _state(step, mesh), metrics={"loss": LOSSES.get(step)},
                             force=step == 5)]
        mgr.wait()
        steps, best = mgr.all_steps(), mgr.best_step()
    with sk.CheckpointManager(root, **policy) as mgr:
        reopened = mgr.all_steps()
        target = {"params": {"w": jax.ShapeDtypeStruct(
            SHAPE, np.float32, sharding=NamedSharding(mesh, P("model", "data")))}}
        loaded = mgr.load(None, sk.Checkpointables(target))["params"]["w"]
        expected = _expected(mgr.latest_step())
        exact = all(np.array_equal(np.asarray(shard.data), expected[shard.index])
                    for shard in loaded.addressable_shards)
    on_disk = sorted(os.listdir(root)) if jax.process_index() == 0 else None
    return {"saved": saved, "steps": steps, "best": best, "reopened": reopened,
            "exact": exact, "on_disk": on_disk, **_preempted(root + "-preempted", mesh)}


def _preempted(root: str, mesh: Mesh) -> dict:
    """Process 1 receives SIGTERM; both processes must save the same step."""
    with sk.CheckpointManager(root, save_interval_steps=1000) as mgr:
        source = mgr._preemption.source
        stopped = None
        for step in range(1, 2000):
            if jax.process_index() == 1 and step == 5:
                os.kill(os.getpid(), signal.SIGTERM)
            mgr.save(step, _state(step, mesh))
            if mgr.reached_preemption(step):
                stopped = step
                break
            time.sleep(0.01)
        mgr.wait()
        return {"source": source, "preempted_at": stopped, "preempted_steps": mgr.all_steps()}



FROZEN_SHAPE = (512, 1024)  # 2 MiB of float32: large enough to be remembered


def unchanged_job(root: str) -> dict:
    """A frozen array saved once and linked by the later steps of a
    4-step run with keep_last=2; the adapter changes every step."""
    mesh = _mesh()
    rows = np.arange(np.prod(FROZEN_SHAPE), dtype=np.float32).reshape(FROZEN_SHAPE)
    frozen = job_array(rows, NamedSharding(mesh, P("data", "model")))
    linked = {}
    with sk.CheckpointManager(root, keep_last=2) as mgr:
        for step in range(1, 5):
            adapter = job_array(_expected(step), NamedSharding(mesh, P("data", "model")))
            mgr.save(step, {"frozen": frozen, "adapter": adapter})
            mgr.wait()
            if step > 1 and jax.process_index() == 0:
                linked[step] = _linked_bytes(os.path.join(root, f"{step:09d}"),
                                             os.path.join(root, f"{step - 1:09d}"))
        steps = mgr.all_steps()
        target = {"frozen": jax.ShapeDtypeStruct(FROZEN_SHAPE, np.float32,
                                                 sharding=NamedSharding(mesh, P("model", "data"))),
                  "adapter": jax.ShapeDtypeStruct(SHAPE, np.float32,
                                                  sharding=NamedSharding(mesh, P()))}
        loaded = mgr.load(None, target)
    exact = all(np.array_equal(np.asarray(shard.data), rows[shard.index])
                for shard in loaded["frozen"].addressable_shards)
    exact = exact and all(np.array_equal(np.asarray(shard.data), _expected(4)[shard.index])
                          for shard in loaded["adapter"].addressable_shards)
    return {"steps": steps, "linked": linked, "exact": exact,
            "frozen_bytes": int(rows.nbytes)}


def _linked_bytes(step_dir: str, previous_dir: str) -> int:
    """Bytes of ``step_dir``'s data files that are files of ``previous_dir``."""
    def files(folder):
        data = os.path.join(folder, "state", "data")
        return [os.path.join(data, name) for name in os.listdir(data)]
    earlier = {os.stat(f).st_ino for f in files(previous_dir)}
    return sum(os.stat(f).st_size for f in files(step_dir) if os.stat(f).st_ino in earlier)


def continuous_job(root: str, clock_offsets: list, steps: int) -> dict:
    """Continuous saving with a minimum interval; each process's clock is
    offset from the real one by ``clock_offsets[process]`` seconds."""
    mesh = _mesh()
    offset = clock_offsets[jax.process_index()]
    policy = sk.save_decisions.ContinuousCheckpointingPolicy(minimum_interval_secs=0.2)
    with sk.CheckpointManager(root, save_decision_policy=policy, keep_last=3,
                              clock=lambda: time.time() + offset) as mgr:
        saved = []
        for step in range(steps):
            time.sleep(0.01 * (1 + jax.process_index()))  # loops of uneven speed
            if mgr.save(step, _state(step, mesh)):
                saved.append(step)
        mgr.wait()
        return {"saved": saved, "steps": mgr.all_steps()}


def orbax_policies_job(root: str, steps: int) -> dict:
    """Orbax's own policies: a fixed interval (asked on every process) and
    continuous saving (asked on the primary, agreed a few steps later)."""
    from orbax.checkpoint import checkpoint_managers as ocm

    mesh = _mesh()
    policy = ocm.AnySavePolicy([ocm.FixedIntervalPolicy(25),
                                ocm.ContinuousCheckpointingPolicy(minimum_interval_secs=0.05)])
    with sk.CheckpointManager(root, save_decision_policy=policy, keep_last=2) as mgr:
        saved = []
        for step in range(steps):
            time.sleep(0.01 * (1 + jax.process_index()))  # loops of uneven speed
            if mgr.save(step, _state(step, mesh)):
                saved.append(step)
        mgr.wait()
        return {"saved": saved}
