"""Checkpoints crossing between C++ and Python, both ways, through the C++
example programs (examples/cpp): Python saves and ``load_params`` reads,
``write_checkpoint`` writes and Python loads.

The programs are found in $SHARDKEEP_EXAMPLES_DIR (scripts/test.sh points
it at its CMake build), else in build/cpp/examples/cpp of this checkout.
Without them the tests fail, saying how to build them.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess

import jax
import ml_dtypes
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import assert_same_bits, make_mesh
from shardkeep.base import tree_codec

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_HINT = (
    "build them with:\n"
    "  cmake -S . -B build/cpp -G Ninja -DSHARDKEEP_BUILD_EXAMPLES=ON\n"
    "  cmake --build build/cpp --target load_params write_checkpoint\n"
    "or set SHARDKEEP_EXAMPLES_DIR to the folder holding them")


@pytest.fixture(scope="module")
def examples() -> pathlib.Path:
    folder = pathlib.Path(os.environ.get("SHARDKEEP_EXAMPLES_DIR",
                                         REPO / "build/cpp/examples/cpp"))
    for name in ("load_params", "write_checkpoint"):
        if not os.access(folder / name, os.X_OK):
            pytest.fail(f"the C++ example {folder / name} is missing; {BUILD_HINT}")
    return folder


def run(program: pathlib.Path, *args: str) -> str:
    done = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{program.name} {args} failed:\n{done.stderr}"
    return done.stdout


def parse_load_params(output: str) -> tuple[dict[str, list[str]], list[str]]:
    """{path: fields after the path} for each leaf line, and the total line."""
    leaves, total = {}, None
    for line in output.splitlines():
        fields = line.split("\t")
        if fields[0] == "total":
            total = fields[1:]
        else:
            assert fields[0] in ("array", "scalar", "string", "none"), line
            leaves[fields[1]] = [fields[0], *fields[2:]]
    assert total is not None, output
    return leaves, total


def expected_stats(value) -> tuple[float, float] | None:
    """(l2, sum) as load_params computes them: floats read as float32,
    integers as int64, accumulated in float64; None for other dtypes."""
    x = np.asarray(value)
    if x.dtype in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        v = x.astype(np.float32).astype(np.float64)
    elif np.issubdtype(x.dtype, np.integer):
        v = x.astype(np.int64).astype(np.float64)
    else:
        return None
    return math.sqrt(float(np.sum(v * v))), float(np.sum(v))


def check_against(output: str, tree, prefix: str = "") -> None:
    """Every leaf of ``tree`` under ``prefix`` is printed as load_params
    should, and nothing else is."""
    leaves, total = parse_load_params(output)
    _, flat = tree_codec.flatten(tree)
    flat = [leaf for leaf in flat if leaf.path.startswith(prefix)]
    assert sorted(leaves) == sorted(leaf.path for leaf in flat)
    parameters = arrays = 0
    for leaf in flat:
        printed, value = leaves[leaf.path], leaf.value
        if value is None:
            assert printed == ["none"]
        elif isinstance(value, str):
            assert printed[0] == "string" and json.loads(printed[1]) == value
        elif isinstance(value, (bool, int, float)):
            dtype = {bool: "bool", int: "int64", float: "float64"}[type(value)]
            assert printed[:2] == ["scalar", dtype]
            assert json.loads(printed[2]) == value and type(json.loads(printed[2])) is type(value)
        else:
            x = np.asarray(value)
            kind, dtype, shape, elements, l2, total_sum = printed
            assert (kind, dtype) == ("array", x.dtype.name)
            assert shape == "[" + ",".join(map(str, x.shape)) + "]"
            assert elements == f"elements={x.size}"
            stats = expected_stats(x)
            if stats is None:
                assert (l2, total_sum) == ("l2=-", "sum=-")
            else:
                assert float(l2.removeprefix("l2=")) == pytest.approx(stats[0], rel=1e-12), leaf.path
                assert float(total_sum.removeprefix("sum=")) == pytest.approx(
                    stats[1], rel=1e-12, abs=1e-9), leaf.path
            parameters += x.size
            arrays += 1
    assert total == [f"parameters={parameters}", f"arrays={arrays}"]


def flax_like_state() -> dict:
    """Nested dicts of params (one kernel sharded over the 8 CPU devices,
    bfloat16 and float32), a real optax Adam state (tuples and named
    tuples), integer and bool arrays, scalars, a string and None."""
    rng = np.random.default_rng(13)
    mesh = make_mesh((8,), ("data",))
    kernel = rng.standard_normal((64, 16)).astype(np.float32)
    params = {
        "Dense_0": {
            "kernel": jax.device_put(kernel, NamedSharding(mesh, P("data", None))),
            "bias": np.linspace(-1, 1, 16).astype(ml_dtypes.bfloat16),
        },
        "Embed_0": {"embedding": rng.standard_normal((32, 8)).astype(ml_dtypes.bfloat16)},
        "LayerNorm_0": {"scale": np.ones(8, np.float16), "offset": np.zeros(8, np.float64)},
    }
    return {
        "params": params,
        "opt_state": optax.adam(1e-3).init(params),
        "token_counts": np.arange(-5, 10, dtype=np.int32).reshape(3, 5),
        "mask": np.array([True, False, True]),
        "step": 1200,
        "learning_rate": 0.125,
        "finished": False,
        "name": "tiny transformer",
        "nothing": None,
    }


def test_cpp_reads_what_python_saved(examples, ckpt):
    state = flax_like_state()
    sk.save(ckpt, state)
    check_against(run(examples / "load_params", ckpt), state)
    # Only the params, as an inference server would read them.
    check_against(run(examples / "load_params", ckpt, "state", "params/"), state, "params/")


def test_cpp_reads_the_params_checkpointable_of_a_manager_save(examples, tmp_path):
    state = flax_like_state()
    with sk.CheckpointManager(str(tmp_path)) as manager:
        manager.save(3, sk.Checkpointables(params=state["params"],
                                           opt_state=state["opt_state"]), force=True)
        manager.wait()
        path = manager.step_path(3)
    # With no checkpointable named, load_params picks "params".
    check_against(run(examples / "load_params", path), state["params"])


def test_cpp_refuses_a_path_without_a_checkpoint(examples, tmp_path):
    done = subprocess.run([str(examples / "load_params"), str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "NotFound" in done.stderr and "absent" in done.stderr


def written_state(step: int) -> dict:
    """What examples/cpp/write_checkpoint.cc writes, from its formulas."""
    flat = np.arange(16 * 8, dtype=np.float32)
    kernel = (np.arange(8 * 6) % 17 - 8).astype(np.float32) * np.float32(0.125)
    return {
        "params": {
            "embed": (flat * np.float32(0.25) - np.float32(16)).reshape(16, 8),
            "dense": {
                "kernel": kernel.astype(ml_dtypes.bfloat16).reshape(8, 6),
                "bias": np.arange(6, dtype=np.float32) - np.float32(2.5),
            },
        },
        "step": step,
        "learning_rate": 0.001,
    }


def assert_same_tree(actual, expected) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        if isinstance(e, np.ndarray):
            assert_same_bits(a, e)
        else:
            assert type(a) is type(e) and a == e


def test_python_loads_what_cpp_wrote(examples, ckpt):
    run(examples / "write_checkpoint", ckpt, "7")
    expected = written_state(7)
    assert_same_tree(sk.load(ckpt), expected)
    loaded = sk.load_checkpointables(ckpt)
    assert loaded["config"] == {"model": "tiny", "vocab": 16, "hidden": 8}
    info = sk.metadata(ckpt)
    assert info.step == 7
    assert info.custom_metadata == {"written_by": "examples/cpp/write_checkpoint"}
    embed = next(leaf for leaf in info.checkpointables["state"].leaves
                 if leaf.path == "params/embed")
    assert embed.sharding == {"type": "named", "axis_names": ["data"], "mesh_shape": [4],
                              "spec": ["data", None], "device_ids": [0, 1, 2, 3]}

    # Onto the 8 devices with a sharding of the loader's choosing.
    mesh = make_mesh((4, 2), ("data", "model"))
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
            mesh, P("data", "model") if x.ndim == 2 else P())),
        expected["params"])
    params = sk.load(ckpt, {"params": target, "step": None, "learning_rate": None})["params"]
    assert params["embed"].sharding == target["embed"].sharding
    assert_same_tree(jax.tree.map(np.asarray, params), expected["params"])


def test_the_examples_round_trip_through_s3(examples, s3):
    url = s3.url("cpp/ckpt")
    run(examples / "write_checkpoint", url, "9")
    expected = written_state(9)
    assert_same_tree(sk.load(url), expected)
    check_against(run(examples / "load_params", url), expected)
