"""The content of the format-compatibility checkpoints in cpp/testdata/compat.

``expected_*`` describe the values, computed from nothing but numpy and
ml_dtypes, with values every dtype represents exactly (so they can never
round differently). ``save`` is the scenario each process of a 4-process
job runs to write one checkpoint; scripts/make_compat_checkpoints.py runs
it, and python/tests/test_compat_checkpoints.py loads the result.
"""

import collections

import ml_dtypes
import numpy as np
from job_arrays import job_mesh

# Every dtype a checkpoint can hold (cpp/src/core/dtype.cc).
DTYPES = ("bool", "int4", "uint4", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "float16", "bfloat16", "float32", "float64",
          "complex64", "complex128", "float8_e4m3fn", "float8_e4m3fnuz",
          "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e3m4",
          "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn")
SHAPE = (16, 24)
# Partition specs (over mesh axes "a" x "b" of a 4 x 2 mesh) taken in turn,
# so that shards are cut by rows, columns, both, or replicated.
SPECS = (("a", "b"), ("a", None), (None, "b"), ())

Pair = collections.namedtuple("Pair", ["first", "second"])


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _alphabet(name: str) -> np.ndarray:
    """Values exactly representable in dtype ``name``, extremes included."""
    dtype = _dtype(name)
    if name == "bool":
        return np.array([True, False, False], dtype)
    if name in ("int4", "uint4") or dtype.kind in "iu":
        info = ml_dtypes.iinfo(dtype) if name in ("int4", "uint4") else np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1, 2, info.max - 1, 5, 3], dtype)
    if name == "float8_e8m0fnu":  # powers of two only, no zero or sign
        return np.array([0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 64.0], dtype)
    values = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -4.0], np.float64)
    if dtype.kind == "c":
        return (values + 1j * values[::-1]).astype(dtype)
    return values.astype(dtype)


def expected_array(name: str) -> np.ndarray:
    alphabet = _alphabet(name)
    index = (np.arange(SHAPE[0] * SHAPE[1]) * 7 + DTYPES.index(name)) % len(alphabet)
    return alphabet[index].reshape(SHAPE)


def expected_tree() -> dict:
    """The "state" pytree as a load without a target rebuilds it (jax arrays
    come back as arrays; compare with np.asarray)."""
    return {
        "arrays": {name: expected_array(name) for name in DTYPES},
        "nested": [Pair(np.arange(5, dtype=np.int32), (np.float32(2.5), "text")), None],
        "scalar_0d": np.array(-3.5, np.float32),
        "step": 1200, "lr": 0.125, "flag": True, "name": "compat",
    }


def expected_small_tree() -> dict:
    """The "state" of the one-process checkpoint "small", which also seeds
    the whole-checkpoint fuzz target (small inputs fuzz fast)."""
    return {"w": np.tile(np.arange(8, dtype=np.float32), (4, 1)),
            "k": (np.array([[1.5, -2.0], [0.5, 4.0]], ml_dtypes.bfloat16),
                  np.arange(3, dtype=np.int8)),
            "step": 3}


EXPECTED_JSON = {"lr": 0.001, "layers": [64, 64], "name": "compat", "nested": {"a": None}}
EXPECTED_BYTES = bytes(range(256)) + b"shardkeep"


def save(path: str, compress: bool, small: bool = False) -> dict:
    """Saves the state (arrays sharded over every device of the job), a json
    and a bytes checkpointable; small chunks, so shards span several.
    ``small``: the small state instead, on one device, compressed."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import shardkeep as sk

    jax.config.update("jax_enable_x64", True)  # keep the 64-bit dtypes
    if small:
        sk.save_checkpointables(
            path, {"state": expected_small_tree(), "config": sk.JsonValue({"a": 1}),
                   "blob": b"xy"},
            options=sk.Options(compression="zstd", chunk_bytes=64), step=3)
        return {"process": jax.process_index()}
    mesh = job_mesh(4, ("a", "b"))
    state = expected_tree()
    for i, name in enumerate(DTYPES):
        value = state["arrays"][name]
        sharding = NamedSharding(mesh, PartitionSpec(*SPECS[i % len(SPECS)]))
        state["arrays"][name] = jax.make_array_from_callback(
            SHAPE, sharding, lambda index, v=value: v[index])
    sk.save_checkpointables(
        path, {"state": state, "config": sk.JsonValue(EXPECTED_JSON),
               "blob": EXPECTED_BYTES},
        options=sk.Options(compression="zstd" if compress else None, chunk_bytes=256),
        step=1200)
    return {"process": jax.process_index()}
