"""Saves a sharded training state asynchronously and restores it onto
another mesh, printing what happened. The main job until the training demo
exists."""

import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import shardkeep as sk


def make_state(mesh):
    key = jax.random.PRNGKey(0)
    fsdp = NamedSharding(mesh, P(("data", "model")))
    tensor = NamedSharding(mesh, P("data", "model"))
    params = {
        "embed": jax.device_put(jax.random.normal(key, (4096, 256), jnp.bfloat16), fsdp),
        "mlp": {"kernel": jax.device_put(jnp.ones((256, 1024), jnp.float32), tensor)},
    }
    return {"params": params, "step": 1200, "note": "example"}


def main():
    devices = np.array(jax.devices())
    print(f"{len(devices)} devices: {devices[0].platform}")
    mesh = Mesh(devices.reshape(2, 4), ("data", "model"))
    state = make_state(mesh)
    with tempfile.TemporaryDirectory() as root:
        path = f"{root}/ckpt/1200"
        start = time.perf_counter()
        future = sk.save_async(path, state)
        blocked = time.perf_counter() - start
        future.result()
        total = time.perf_counter() - start
        print(f"saved {path}: training blocked {blocked * 1e3:.1f} ms, committed after {total * 1e3:.1f} ms")

        other = Mesh(devices.reshape(4, 2), ("x", "y"))
        target = jax.tree.map(lambda a: a, state)
        target["params"] = {
            "embed": jax.ShapeDtypeStruct((4096, 256), jnp.float32,
                                          sharding=NamedSharding(other, P("y", "x"))),
            "mlp": {"kernel": jax.ShapeDtypeStruct((256, 1024), jnp.float32,
                                                   sharding=NamedSharding(other, P(None, "x")))},
        }
        start = time.perf_counter()
        restored = sk.load(path, target)
        print(f"restored onto a (4, 2) mesh with bfloat16 -> float32 in {(time.perf_counter() - start) * 1e3:.1f} ms")
        same = all(
            np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
            for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(restored["params"])))
        assert same and restored["step"] == 1200 and restored["note"] == "example"
        print(f"step {restored['step']}, sharding {restored['params']['embed'].sharding.spec}")
        print("OK: restored state matches the saved one bit for bit")


if __name__ == "__main__":
    main()
