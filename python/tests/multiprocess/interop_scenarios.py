"""Orbax scenarios for multi-process jobs (see harness.py).

test_interop_orbax.py runs them as "interop_scenarios:<function>".
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep.interop import orbax as orbax_reader

SHAPE = (16, 8)


def expected() -> dict[str, np.ndarray]:
    w = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    return {"w": w, "r": (w[0] * 3).astype(np.int32)}


def _mesh() -> Mesh:
    devices = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    return Mesh(devices.reshape(2, -1), ("data", "model"))


def _shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    return {"w": NamedSharding(mesh, P("data", "model")), "r": NamedSharding(mesh, P())}


def save_orbax(path: str) -> dict:
    """Every process saves its shards with orbax-checkpoint's StandardCheckpointer."""
    import orbax.checkpoint as ocp

    values, shardings = expected(), _shardings(_mesh())
    state = {name: jax.make_array_from_callback(values[name].shape, shardings[name],
                                                lambda index, v=values[name]: v[index])
             for name in values}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, state)
    return {"saved": True}


def load_orbax(path: str) -> dict:
    """Loads onto a mesh over every process's devices, transposed from the
    save; reports the boxes this process read and checks its shards."""
    reads = []

    class CountingRead(orbax_reader._NamedRead):
        def __init__(self, out, future, where, origin, extent):
            super().__init__(out, future, where, origin, extent)
            reads.append([where.split("'")[1], list(origin), list(extent)])

    orbax_reader._NamedRead = CountingRead
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
