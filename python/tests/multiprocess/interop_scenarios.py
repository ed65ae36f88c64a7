"""Orbax and DCP scenarios for multi-process jobs (see harness.py).

test_interop_orbax.py and test_broadcast_load.py run them as
"interop_scenarios:<function>".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep.interop import orbax as orbax_reader
from job_arrays import job_array, job_mesh

SHAPE = (16, 8)


def expected() -> dict[str, np.ndarray]:
    w = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    return {"w": w, "r": (w[0] * 3).astype(np.int32)}


def _mesh() -> Mesh:
    return job_mesh(2)


def _shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    return {"w": NamedSharding(mesh, P("data", "model")), "r": NamedSharding(mesh, P())}


def save_orbax(path: str) -> dict:
    """Every process saves its shards with orbax-checkpoint's StandardCheckpointer."""
    import orbax.checkpoint as ocp

    values, shardings = expected(), _shardings(_mesh())
    state = {name: job_array(values[name], shardings[name]) for name in values}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, state)
    return {"saved": True}


def load_orbax(path: str) -> dict:
    """Loads onto a mesh over every process's devices, transposed from the
    save; reports the boxes this process read and checks its shards."""
    reads = _count_reads(orbax_reader.OrbaxSource)
    mesh = _mesh()
    values = expected()
    target = {"w": jax.ShapeDtypeStruct(SHAPE, np.float32,
                                        sharding=NamedSharding(mesh, P("model", "data"))),
              "r": jax.ShapeDtypeStruct(values["r"].shape, np.int32,
                                        sharding=NamedSharding(mesh, P()))}
    loaded = sk.load_orbax(path, target)
    for name, array in loaded.items():
        assert array.sharding == target[name].sharding
        for shard in array.addressable_shards:
            got = np.asarray(shard.data)
            assert got.tobytes() == values[name][shard.index].tobytes(), (name, shard.index)
    return {"reads": sorted(reads)}


def _count_reads(source_class) -> list:
    """[leaf path, origin, shape] of every box ``source_class`` reads from
    now on in this process (the source's own reads: tensorstore and torch
    read outside shardkeep's storage counters)."""
    reads: list = []
    original = source_class.read

    def counting_read(source, requests):
        leaves = source.meta().leaves
        reads.extend([leaves[r.leaf].path, r.origin, r.shape] for r in requests)
        return original(source, requests)

    source_class.read = counting_read
    return reads


# Load-and-broadcast of other formats: a checkpoint written by one process
# (the test's), loaded by every process of the job onto a mesh whose
# "replica" axis spans the processes, so that every box is held by several.
BROADCAST_SHAPES = {"w": (64, 32), "big": (1024, 1024), "b": (32,)}
KEY_COUNT = 8
_BROADCAST = sk.Options(broadcast_load=True, allow_lossy_cast=True)  # "b" loads as bfloat16


def broadcast_values() -> dict[str, np.ndarray]:
    """The arrays the checkpoints hold, the same in every process."""
    out = {}
    for name, shape in BROADCAST_SHAPES.items():
        count = int(np.prod(shape))
        out[name] = ((np.arange(count, dtype=np.float64) - count / 3) / 8).astype(
            np.float32).reshape(shape)
    return out


def _replica_mesh() -> Mesh:
    return job_mesh(jax.process_count(), ("replica", "model"))


def _broadcast_target(mesh: Mesh, with_keys: bool) -> dict:
    specs = {"w": P(None, "model"), "big": P(), "b": P("model")}
    target = {name: jax.ShapeDtypeStruct(shape, np.float32,
                                         sharding=NamedSharding(mesh, specs[name]))
              for name, shape in BROADCAST_SHAPES.items()}
    # A cast on read: the bytes sent to the other holders are the target's.
    target["b"] = jax.ShapeDtypeStruct(BROADCAST_SHAPES["b"], jnp.bfloat16,
                                       sharding=target["b"].sharding)
    if with_keys:
        keys = jax.random.split(jax.random.key(0), KEY_COUNT)
        target["rng"] = jax.ShapeDtypeStruct(keys.shape, keys.dtype,
                                             sharding=NamedSharding(mesh, P("model")))
    return target


def _check_broadcast_load(loaded: dict, target: dict, reads: list) -> dict:
    values = broadcast_values()
    for name in BROADCAST_SHAPES:
        array = loaded[name]
        assert array.sharding == target[name].sharding
        want = values[name].astype(target[name].dtype)
        for shard in array.addressable_shards:
            assert np.asarray(shard.data).tobytes() == want[shard.index].tobytes(), name
    if "rng" in target:
        keys = loaded["rng"]
        assert jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key)
        want = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0), KEY_COUNT)))
        for shard in keys.addressable_shards:
            got = np.asarray(jax.random.key_data(shard.data))
            assert got.tobytes() == want[shard.index].tobytes()
    return {"reads": reads}


def broadcast_orbax(path: str) -> dict:
    """Loads the Orbax checkpoint at ``path`` (written by orbax's
    CheckpointManager, typed keys included) with load-and-broadcast;
    checks every shard and reports the boxes this process read."""
    reads = _count_reads(orbax_reader.OrbaxSource)
    target = _broadcast_target(_replica_mesh(), with_keys=True)
    loaded = sk.load_orbax(path, target, options=_BROADCAST)
    return _check_broadcast_load(loaded, target, reads)


def broadcast_dcp(path: str) -> dict:
    """As ``broadcast_orbax`` for a DCP checkpoint."""
    from shardkeep.interop import dcp as dcp_reader

    reads = _count_reads(dcp_reader.DcpSource)
    target = _broadcast_target(_replica_mesh(), with_keys=False)
    loaded = sk.load_dcp(path, target, allow_pickle=True,
                         options=_BROADCAST)
    return _check_broadcast_load(loaded, target, reads)


def step_values(step: int) -> dict[str, np.ndarray]:
    """What an Orbax run saved at ``step`` (test_orbax_resume.py)."""
    return {name: value + step for name, value in expected().items()}


def resume_orbax(root: str) -> dict:
    """Every process opens a shardkeep manager on a root of Orbax steps,
    restores the latest onto a mesh over every process's devices, saves the
    next step in shardkeep's format, and reopens the root."""
    mesh = _mesh()
    shardings = _shardings(mesh)
    values = step_values(2)
    target = {name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=shardings[name])
              for name, value in values.items()}
    with sk.CheckpointManager(root, save_interval_steps=1) as mgr:
        listed, orbax = mgr.all_steps(), mgr.orbax_steps()
        step, state = mgr.restore(target)
        for name, array in state.items():
            for shard in array.addressable_shards:
                assert np.asarray(shard.data).tobytes() == values[name][shard.index].tobytes()
        mgr.save(3, state)
        mgr.wait()
        after = mgr.all_steps()
    with sk.CheckpointManager(root) as mgr:
        reopened = mgr.all_steps()
    return {"listed": listed, "orbax": orbax, "restored": step, "after": after,
            "reopened": reopened}
