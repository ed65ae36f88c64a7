"""Calls that only some processes of a job make (test_multiprocess.py).

Collective operations are identified by ids the processes agree on
(shardkeep.job.distributed.agree): a lone call fails, naming the processes
that did not join, and the calls the whole job makes afterwards work.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep.job import exchange
from job_arrays import job_array, job_mesh

SHAPE = (8, 4)
LONE_TIMEOUT_S = 3.0


def _mesh() -> Mesh:
    return job_mesh(jax.process_count())


def _value(step: int) -> np.ndarray:
    return np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) + step


def _state(step: int, mesh: Mesh) -> dict:
    value = _value(step)
    w = job_array(value, NamedSharding(mesh, P("data", "model")))
    return {"w": w}


def _target(mesh: Mesh, spec: P) -> dict:
    return {"w": jax.ShapeDtypeStruct(SHAPE, np.float32, sharding=NamedSharding(mesh, spec))}


def _exact(tree: dict, step: int) -> bool:
    expected = _value(step)
    return all(np.array_equal(np.asarray(s.data), expected[s.index])
               for s in tree["w"].addressable_shards)


def _lone(call) -> dict:
    """Runs ``call``, which must fail with shardkeep.TimeoutError; its message and time."""
    started = time.monotonic()
    try:
        call()
    except sk.TimeoutError as e:
        return {"error": str(e), "seconds": time.monotonic() - started}
    raise AssertionError("a call made by one process alone succeeded")


def lone_calls(path: str) -> dict:
    """Process 0 saves alone, process 1 exchanges alone; then the whole job
    saves (the lone save's path too), loads, broadcasts and runs a manager
    with a local tier. ``path``: a folder for all of it."""
    root = path
    me = jax.process_index()
    mesh = _mesh()
    short = sk.Options(timeout_s=LONE_TIMEOUT_S)
    result: dict = {}
    if me == 0:
        result["lone_save"] = _lone(lambda: sk.save(f"{root}/lone", {"x": np.arange(3)},
                                                    options=short))
    # Every process, process 0 once its lone save has failed: a save of a
    # path no process has used, then one of the lone save's path.
    sk.save(f"{root}/after", _state(1, mesh))
    sk.save(f"{root}/lone", _state(2, mesh))
    result["after"] = _exact(sk.load(f"{root}/after", _target(mesh, P("model", "data"))), 1)
    result["again"] = _exact(sk.load(f"{root}/lone", _target(mesh, P())), 2)

    if me == 1:
        result["lone_exchange"] = _lone(lambda: exchange.exchange_bytes(
            {0: [np.zeros(4, np.uint8)]}, name="lone", timeout_s=LONE_TIMEOUT_S))
    # Load-and-broadcast: its exchanges are collective too.
    broadcast = sk.Options(broadcast_load=True)
    result["broadcast"] = _exact(sk.load(f"{root}/lone", _target(mesh, P()),
                                         options=broadcast), 2)

    with sk.CheckpointManager(f"{root}/run", local_root=f"{root}/local-{{process}}",
                              local_save_interval_steps=1) as mgr:
        for step in (1, 2):
            mgr.save(step, _state(step, mesh))
        mgr.wait()
        result["steps"] = mgr.all_steps()
        step, restored = mgr.restore(_target(mesh, P("data", "model")))
        result["restored"] = [step, _exact(restored, step)]
    return result
