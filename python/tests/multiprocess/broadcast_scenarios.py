"""Load-and-broadcast in real multi-process jobs (see harness.py).

The job saves one checkpoint with leaves of every kind load-and-broadcast
handles (float32 holding -0.0 and NaN payloads, bfloat16, int8, typed PRNG
keys, a 0-d array, leaves unreplicated, partly and fully replicated, a
float32 leaf loaded as bfloat16, a numpy leaf and a Python scalar), then
loads it onto several layouts with ``broadcast_load`` on and off. Every
process checks its shards bit-exactly against the expected values and
reports the bytes it read from storage (``_core.storage_bytes_read``; files
are read, not mapped, so that they count) and the bytes its layout needs.
"""

from __future__ import annotations

import math
import time

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from shardkeep.loading import broadcast_load
from shardkeep.base import shardings
from job_arrays import job_array, job_mesh

KEY_IMPL = "threefry2x32"
# name -> (shape, stored dtype, loaded dtype, spec over ("replica", "model")).
LEAVES = {
    "f32": ((256, 128), "float32", "float32", P("model", None)),
    "bf16": ((128, 192), "bfloat16", "bfloat16", P(None, "model")),
    "i8": ((192, 80), "int8", "int8", P("model")),
    "keys": ((64,), "uint32", "key", P("model")),
    "zero_d": ((), "float32", "float32", P()),
    "unreplicated": ((128, 64), "float32", "float32", P(("replica", "model"))),
    "replicated": ((96, 80), "int32", "int32", P()),
    "cast": ((64, 128), "float32", "bfloat16", P(None, "model")),
}
NUMPY_SHAPE = (6, 5)
STEP = 7


def expected(name: str) -> np.ndarray:
    """Leaf ``name`` as saved (key data for "keys"), the same in every process."""
    if name == "numpy":
        return np.arange(math.prod(NUMPY_SHAPE), dtype=np.float64).reshape(NUMPY_SHAPE) / 7
    if name == "keys":
        return np.asarray(jax.random.key_data(
            jax.random.split(jax.random.key(3, impl=KEY_IMPL), LEAVES["keys"][0][0])))
    shape, dtype, _, _ = LEAVES[name]
    count = math.prod(shape)
    values = (np.arange(count, dtype=np.float64) - count / 3) / 8
    if name == "f32":
        bits = values.astype(np.float32).view(np.uint32)
        bits[::97] = 0x80000000  # -0.0
        bits[5::101] = 0x7FC00000 | np.arange(len(bits[5::101]), dtype=np.uint32) + 1
        bits[7::103] = 0xFFA12345  # a negative signalling NaN
        return bits.view(np.float32).reshape(shape)
    if name == "bf16":
        bits = values.astype(ml_dtypes.bfloat16).view(np.uint16)
        bits[::89] = 0x8000
        bits[3::91] = 0x7FC1
        return bits.view(ml_dtypes.bfloat16).reshape(shape)
    if name == "i8":
        return (np.arange(count) % 256 - 128).astype(np.int8).reshape(shape)
    if name == "zero_d":
        return np.array(-0.0, np.float32)
    return values.astype(dtype).reshape(shape)


def loaded_value(name: str) -> np.ndarray:
    """What a load of leaf ``name`` holds (the cast leaf in its new dtype)."""
    value = expected(name)
    return value.astype(ml_dtypes.bfloat16) if name == "cast" else value


def mesh(replicas: int) -> Mesh:
    """All devices of the job (one per process), ``replicas`` rows of the
    processes in order; each row holds one copy of the model."""
    return job_mesh(replicas, ("replica", "model"))


def state(m: Mesh) -> dict:
    out = {}
    for name, (shape, _, _, spec) in LEAVES.items():
        value = expected(name)
        sharding = NamedSharding(m, spec)
        if name == "keys":
            out[name] = jax.random.wrap_key_data(job_array(value, sharding), impl=KEY_IMPL)
        else:
            assert value.shape == shape, name
            out[name] = job_array(value, sharding)
    out["numpy"] = expected("numpy")
    out["step"] = STEP
    return out


def targets(m: Mesh) -> dict:
    out = {}
    for name, (shape, _, loaded, spec) in LEAVES.items():
        dtype = (jax.random.key(0, impl=KEY_IMPL).dtype if loaded == "key"
                 else jax.numpy.dtype(loaded))
        out[name] = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(m, spec))
    out["numpy"] = np.zeros(NUMPY_SHAPE, np.float64)
    out["step"] = 0
    return out


def shard_bytes(loaded: dict, target: dict) -> dict[str, list[str]]:
    """Checks every leaf against the expected bits; returns each array
    leaf's local shards as hex, to compare loads with each other."""
    assert loaded["step"] == STEP, loaded["step"]
    assert loaded["numpy"].tobytes() == expected("numpy").tobytes()
    out = {}
    for name in LEAVES:
        got, want = loaded[name], target[name]
        assert got.shape == want.shape and got.dtype == want.dtype, (name, got)
        assert got.sharding == want.sharding, (name, got.sharding)
        full = loaded_value(name)
        out[name] = []
        for shard in sorted(got.addressable_shards, key=lambda s: s.device.id):
            data = jax.random.key_data(shard.data) if name == "keys" else shard.data
            index = shard.index[:len(want.shape)]  # keys: their data's trailing dims whole
            raw = np.asarray(data).tobytes()
            assert raw == full[index].tobytes(), (name, index, jax.process_index())
            out[name].append(raw.hex())
    return out


def stored_bytes(m: Mesh) -> dict:
    """Bytes of stored data the layout of ``m`` needs: ``one_copy`` in the
    whole job when each box is read once, ``every_holder`` when every
    process reads the boxes its devices hold; numpy leaves are read by
    every process either way."""
    one_copy = every_holder = 0
    for name, (shape, stored, _, spec) in LEAVES.items():
        item = np.dtype(ml_dtypes.bfloat16 if stored == "bfloat16" else stored).itemsize
        key = expected("keys").shape[1:] if name == "keys" else ()
        for (_, extent), holders in shardings.box_holders(NamedSharding(m, spec),
                                                          shape).items():
            nbytes = math.prod(extent + key) * item
            one_copy += nbytes
            every_holder += nbytes * len(holders)
    numpy_bytes = math.prod(NUMPY_SHAPE) * 8 * jax.process_count()
    return {"one_copy": one_copy + numpy_bytes, "every_holder": every_holder + numpy_bytes}


def _load(path: str, m: Mesh, broadcast: bool) -> tuple[dict, dict]:
    options = sk.Options(map_files=False, broadcast_load=broadcast, allow_lossy_cast=True)
    target = targets(m)
    before = _core.storage_bytes_read()
    start = time.perf_counter()
    loaded = sk.load(path, target, options=options)
    jax.block_until_ready([loaded[name] for name in LEAVES])
    elapsed = time.perf_counter() - start
    read = _core.storage_bytes_read() - before
    return shard_bytes(loaded, target), {"bytes_read": read, "seconds": elapsed}


def _counting_exchanges() -> list:
    """Counts the exchanges load-and-broadcast makes (a list, one entry per call)."""
    calls = []
    exchange = broadcast_load.exchange.exchange_bytes

    def counted(outgoing, **kwargs):
        calls.append(sum(b.nbytes for buffers in outgoing.values() for b in buffers))
        return exchange(outgoing, **kwargs)

    broadcast_load.exchange.exchange_bytes = counted
    return calls


def layouts(path: str) -> dict:
    """Saves the checkpoint (2 replicas x 2 processes), then loads it onto 2
    replicas x 2 processes and 4 replicas x 1 with broadcast on and off,
    and once more on with exchanges cut into small batches. Boxes from 8 KiB
    up are cut into pieces, as boxes of megabytes would be."""
    broadcast_load.MIN_CUT_BYTES = 8 << 10
    sk.save(path, state(mesh(2)))
    calls = _counting_exchanges()
    result = {}
    for replicas in (2, 4):
        m = mesh(replicas)
        off, off_stats = _load(path, m, broadcast=False)
        calls.clear()
        on, on_stats = _load(path, m, broadcast=True)
        on_stats["exchanges"] = len(calls)
        assert on == off, f"broadcast load differs from every-process load ({replicas} replicas)"
        result[f"{replicas}x{4 // replicas}"] = {
            "on": on_stats, "off": off_stats, **stored_bytes(m)}
    batch_bytes = broadcast_load.BATCH_BYTES
    broadcast_load.BATCH_BYTES = 4 << 10
    try:
        calls.clear()
        small, _ = _load(path, mesh(4), broadcast=True)
    finally:
        broadcast_load.BATCH_BYTES = batch_bytes
    assert small == on, "a load in small exchanges differs"
    result["small_batches"] = {"exchanges": len(calls)}
    return result
