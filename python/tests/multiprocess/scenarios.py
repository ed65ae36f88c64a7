"""Scenario functions for multi-process test jobs (see harness.py).

Each runs in every process of a job, after ``jax.distributed.initialize``,
and returns a JSON-serialisable result. Every process builds the same
deterministic state (``expected``) and checks what it loads against it
for the shards it holds.
"""

from __future__ import annotations

import os
import signal
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import shardkeep as sk
from job_arrays import job_devices

# name -> (shape, dtype, partition spec over mesh axes ("a", "b")).
# Saved on a (4, 2) mesh of 4 processes x 2 devices whose row p holds
# process p's devices, "rows" is replicated within each process and
# "cols" across processes; "tiny" has fewer elements than replicas.
ARRAYS = {
    "sharded": ((256, 192), "float32", P("a", "b")),
    "replicated": ((128, 96), "int32", P()),
    "rows": ((32, 24), "bfloat16", P("a", None)),
    "cols": ((24, 64), "float32", P(None, "b")),
    "tiny": ((3,), "int16", P()),
    "zero_d": ((), "float32", P()),
}
NUMPY_SHAPE = (5, 7)
SCALARS = {"step": 7, "lr": 3.25}


def expected(name: str) -> np.ndarray:
    """The value of array leaf ``name`` (or "numpy"), the same in every process."""
    if name == "numpy":
        return np.arange(np.prod(NUMPY_SHAPE), dtype=np.float64).reshape(NUMPY_SHAPE) / 3
    shape, dtype, _ = ARRAYS[name]
    offset = sorted(ARRAYS).index(name) * 1000
    values = (np.arange(int(np.prod(shape)), dtype=np.int64) % 30011) + offset
    return values.reshape(shape).astype(jax.numpy.dtype(dtype))


def mesh(shape=(4, 2), transpose: bool = False) -> Mesh:
    """A mesh over all devices of the job, sorted by id (process-major)."""
    devices = job_devices()
    if transpose:
        return Mesh(devices.reshape(shape[::-1]).T, ("a", "b"))
    return Mesh(devices.reshape(shape), ("a", "b"))


def make_state(m: Mesh, names=None) -> dict:
    state = {}
    for name in names or ARRAYS:
        shape, _, spec = ARRAYS[name]
        value = expected(name)
        state[name] = jax.make_array_from_callback(
            shape, NamedSharding(m, spec), lambda index, v=value: v[index])
    if names is None:
        state["numpy"] = expected("numpy")
        state.update(SCALARS)
    return state


def targets(m: Mesh, specs: dict | None = None, names=None) -> dict:
    out = {}
    for name in names or ARRAYS:
        shape, dtype, spec = ARRAYS[name]
        spec = P(*specs[name]) if specs and name in specs else spec
        out[name] = jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype),
                                         sharding=NamedSharding(m, spec))
    if names is None:
        out["numpy"] = np.zeros(NUMPY_SHAPE, np.float64)
        out.update({k: 0 if isinstance(v, int) else 0.0 for k, v in SCALARS.items()})
    return out


def check_state(loaded: dict, target: dict) -> int:
    """Asserts ``loaded`` holds the expected values bit-exactly; returns shards checked."""
    checked = 0
    for name, want in target.items():
        got = loaded[name]
        if name in SCALARS:
            assert got == SCALARS[name] and type(got) is type(SCALARS[name]), (name, got)
            continue
        if name == "numpy":
            assert got.dtype == np.float64 and got.tobytes() == expected(name).tobytes()
            continue
        assert isinstance(got, jax.Array), (name, type(got))
        assert got.shape == want.shape and got.dtype == want.dtype, (name, got)
        assert got.sharding == want.sharding, (name, got.sharding, want.sharding)
        full = expected(name)
        for shard in got.addressable_shards:
            data = np.asarray(shard.data)
            assert data.tobytes() == full[shard.index].tobytes(), (name, shard.index)
            checked += 1
    return checked


def _options(replica_parallel: bool = True, timeout_s: float = 60.0) -> sk.Options:
    # Small chunks so that every shard is stored as several chunks.
    return sk.Options(replica_parallel=replica_parallel, timeout_s=timeout_s,
                      chunk_bytes=16 << 10)


def save_state(path: str, replica_parallel: bool = True, use_async: bool = False,
               verify: bool = False) -> dict:
    """Saves the test state on a (4, 2)-shaped mesh (needs 8 devices in all)."""
    m = mesh()
    state = make_state(m)
    options = _options(replica_parallel)
    if use_async:
        future = sk.save_async(path, state, options=options)
        future.result()
    else:
        sk.save(path, state, options=options)
    result = {"process": jax.process_index(),
              "devices": [d.id for d in jax.local_devices()],
              "committed": os.path.exists(os.path.join(path, "_SHARDKEEP"))}
    if verify:
        result["checked"] = check_state(sk.load(path, targets(m)), targets(m))
    return result


def load_state(path: str, mesh_shape=(4, 2), transpose: bool = False,
               specs: dict | None = None, untargeted: bool = False) -> dict:
    """Loads the test state onto a new mesh and checks every local shard."""
    m = mesh(tuple(mesh_shape), transpose)
    want = targets(m, specs)
    loaded = sk.load(path, want)
    result = {"checked": check_state(loaded, want),
              "global": all(not loaded[n].is_fully_addressable or jax.process_count() == 1
                            for n in ARRAYS)}
    if untargeted:
        plain = sk.load(path)
        for name in list(ARRAYS) + ["numpy"]:
            assert isinstance(plain[name], np.ndarray), (name, type(plain[name]))
            assert plain[name].tobytes() == expected(name).tobytes(), name
        assert plain["step"] == 7 and plain["lr"] == 3.25
    return result


def checkpointables(path: str) -> dict:
    """Several checkpointables saved by the job, loaded whole and in part."""
    m = mesh((2, 2))
    names = ["sharded", "replicated", "cols"]
    sk.save_checkpointables(
        path, {"state": make_state(m, names), "config": sk.JsonValue({"lr": 0.5}),
               "blob": b"\x00loader-state\xff"},
        options=_options(), step=3, custom_metadata={"run": "mp"})
    info = sk.metadata(path)
    others = sk.load_checkpointables(path, {"config": None, "blob": None})
    assert others == {"config": {"lr": 0.5}, "blob": b"\x00loader-state\xff"}, others
    # Partial load of one leaf, onto another layout (transposed mesh).
    m2 = mesh((2, 2), transpose=True)
    want = targets(m2, {"cols": ("b", "a")}, names=["cols"])
    part = sk.load_checkpointables(path, {"state": want}, partial=True)["state"]
    checked = check_state(part, want)
    # The whole state with its saved layout.
    full = sk.load(path, targets(m, names=names))
    checked += check_state(full, targets(m, names=names))
    return {"checked": checked, "step": info.step,
            "checkpointables": sorted(info.checkpointables)}


def save_with_dead_peer(path: str, victim: int, timeout_s: float) -> dict:
    """Process ``victim`` SIGKILLs itself when its save reaches the barrier
    "written" (after writing its shards, before arriving); the others must
    fail within ``timeout_s`` and commit nothing."""
    import shardkeep.job.distributed as skd

    arrive = skd.JaxCoordination.barrier

    def barrier(self, key, timeout):
        if jax.process_index() == victim and key.endswith("/written"):
            os.kill(os.getpid(), signal.SIGKILL)
        return arrive(self, key, timeout)

    skd.JaxCoordination.barrier = barrier
    state = make_state(mesh())
    start = time.monotonic()
    future = sk.save_async(path, state, options=_options(timeout_s=timeout_s))
    try:
        future.result()
        error, message = None, ""
    except sk.ShardkeepError as e:
        error, message = type(e).__name__, str(e)
    return {"error": error, "message": message, "elapsed_s": time.monotonic() - start,
            "committed": os.path.exists(os.path.join(path, "_SHARDKEEP")),
            "survivors": [p for p in range(jax.process_count()) if p != victim]}


def python_runs_while_save_waits(path: str, delay_s: float) -> dict:
    """Process 1 arrives ``delay_s`` late at the barrier "written"; meanwhile
    process 0's main thread counts in pure Python. The count shows whether
    the save's background thread holds the GIL while it waits."""
    import shardkeep.job.distributed as skd

    arrive = skd.JaxCoordination.barrier

    def barrier(self, key, timeout):
        if jax.process_index() == 1 and key.endswith("/written"):
            time.sleep(delay_s)
        return arrive(self, key, timeout)

    skd.JaxCoordination.barrier = barrier
    state = make_state(mesh((2, 1)), ["sharded", "replicated"])
    # Pure-Python speed of this process, for comparison.
    count, end = 0, time.monotonic() + 0.3
    while time.monotonic() < end:
        count += 1
    baseline = count / 0.3
    future = sk.save_async(path, state, options=_options())
    start, count = time.monotonic(), 0
    while not future.done():
        count += 1
    waited = time.monotonic() - start
    future.result()
    return {"waited_s": waited, "rate": count / max(waited, 1e-9), "baseline": baseline}


def save_after_one_process_failed(path: str, timeout_s: float) -> dict:
    """Process 1 fails its first save before reaching the engine (a bad leaf);
    the others' save of that call times out. The next save must then work
    everywhere: the failed call's id was never agreed. It also holds
    a process-local jax array, which must be written once."""
    state = {"w": np.arange(16, dtype=np.float32)}
    first = dict(state, bad=object()) if jax.process_index() == 1 else state
    try:
        sk.save(path + "-first", first, options=sk.Options(timeout_s=timeout_s))
        first_error = None
    except sk.ShardkeepError as e:
        first_error = type(e).__name__
    # A process-local jax array (each process has its own) is written once.
    state["local"] = jax.numpy.asarray(5, dtype=jax.numpy.int32)
    sk.save(path, state, options=sk.Options(timeout_s=60.0))
    loaded = sk.load(path)
    return {"first_error": first_error,
            "second_ok": bool(np.array_equal(loaded["w"], state["w"])
                              and int(loaded["local"]) == 5)}


def save_disagreeing_trees(path: str) -> dict:
    """Process 1 saves "w" as float16, the others as float32: only the
    primary's meta.json would be written, so the save must fail everywhere,
    naming process 1, and write nothing. The next save agrees and works."""
    dtype = np.float16 if jax.process_index() == 1 else np.float32
    try:
        sk.save(path + "-first", {"w": np.arange(16, dtype=dtype)},
                options=sk.Options(timeout_s=60.0))
        first_error, message = None, ""
    except sk.ShardkeepError as e:
        first_error, message = type(e).__name__, str(e)
    state = {"w": np.arange(16, dtype=np.float32)}
    sk.save(path, state, options=sk.Options(timeout_s=60.0))
    # Listed after the second save, which the primary joins only once it
    # has cleaned up after the first.
    return {"first_error": first_error, "message": message,
            "left": sorted(os.listdir(os.path.dirname(path))),
            "second_ok": bool(np.array_equal(sk.load(path)["w"], state["w"]))}


KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def _key_data(impl: str, shape: tuple) -> np.ndarray:
    """Deterministic key data of ``impl`` for keys of ``shape``, the same everywhere."""
    keys = jax.random.split(jax.random.key(len(impl), impl=impl), int(np.prod(shape)))
    return np.asarray(jax.random.key_data(keys)).reshape(shape + (-1,))


def typed_keys(path: str) -> dict:
    """Typed PRNG keys of each implementation, sharded over every process
    (and one replicated), saved asynchronously, then loaded onto a
    transposed mesh and without a target; returns the shards checked."""
    m = mesh((2, 2))
    state = {}
    for impl in KEY_IMPLS:
        for name, spec in ((impl, P("a", "b")), (impl + "-replicated", P())):
            data = _key_data(impl, (4, 6))
            physical = jax.make_array_from_callback(
                data.shape, NamedSharding(m, spec), lambda index, d=data: d[index])
            state[name] = jax.random.wrap_key_data(physical, impl=impl)
    sk.save_async(path, state, options=_options()).result()
    other = mesh((2, 2), transpose=True)
    target = {name: jax.ShapeDtypeStruct((4, 6), keys.dtype,
                                         sharding=NamedSharding(other, P("b", None)))
              for name, keys in state.items()}
    checked = 0
    for loaded, want in ((sk.load(path, target), target), (sk.load(path), state)):
        for name, keys in loaded.items():
            impl = name.split("-")[0]
            assert keys.dtype == state[name].dtype and keys.shape == (4, 6), (name, keys)
            assert keys.sharding == want[name].sharding, (name, keys.sharding)
            full = _key_data(impl, (4, 6))
            for shard in keys.addressable_shards:
                got = np.asarray(jax.random.key_data(shard.data))
                assert got.tobytes() == full[shard.index[:2]].tobytes(), (name, shard.index)
                checked += 1
    return {"checked": checked}
