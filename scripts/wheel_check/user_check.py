"""What a user does right after `pip install shardkeep-*.whl`, run by
scripts/test_wheels.sh in a fresh virtual environment that holds only the
wheel and its dependencies, from a folder outside the source tree, with
only that environment's bin folder on PATH (no compiler).

Uses the public API (README.md) and the `shardkeep` command only: saves a
sharded tree on 8 CPU devices, loads it onto another mesh, locally and on
the S3 server the environment names (AWS_ENDPOINT_URL, the keys and
SHARDKEEP_CHECK_BUCKET), and runs `shardkeep info`, `verify`, `export`
and `convert`. Every value is compared bit for bit; any difference or
failure raises.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import shardkeep as sk

# Leaf: (host value, spec on the 2x4 save mesh, spec on the 4x2 load mesh).
# Every split differs between the two, so each load reassembles boxes that
# other devices wrote.
rng = np.random.default_rng(2024)
w = rng.standard_normal((64, 32), dtype=np.float32)
w[0, :4] = [np.nan, -0.0, np.inf, -np.inf]  # values that only bits compare
LEAVES = {
    "w": (w, P("data", "model"), P("y", "x")),
    "emb": (rng.standard_normal((48, 16)).astype(jnp.bfloat16), P("model", None), P(None, "x")),
    "count": (rng.integers(-2**31, 2**31 - 1, (8, 24), dtype=np.int32), P(None, "data"),
              P("x", "y")),
    "mask": (rng.integers(0, 2, (16,), dtype=np.uint8).astype(bool), P(), P("x")),
}


def step(message: str) -> None:
    print(f"[{time.monotonic() - START:6.1f} s] {message}", flush=True)


def check_environment() -> None:
    """The package, its command and nothing else: no source tree, no compiler."""
    prefix = pathlib.Path(sys.prefix).resolve()
    package = pathlib.Path(sk.__file__).resolve()
    assert prefix in package.parents, f"shardkeep imported from {package}, not from {prefix}"
    tool = shutil.which("shardkeep")
    assert tool and pathlib.Path(tool).resolve().parent == prefix / "bin", tool
    for compiler in ("cc", "gcc", "g++", "c++", "clang"):
        assert shutil.which(compiler) is None, f"a compiler is on PATH: {shutil.which(compiler)}"
    assert "LD_LIBRARY_PATH" not in os.environ
    assert jax.device_count() == 8, jax.devices()


def saved_state(mesh: Mesh) -> dict:
    return {"params": {name: jax.device_put(value, NamedSharding(mesh, spec))
                       for name, (value, spec, _) in LEAVES.items()},
            "step": 100}


def target_state(mesh: Mesh) -> dict:
    return {"params": {name: jax.ShapeDtypeStruct(value.shape, value.dtype,
                                                  sharding=NamedSharding(mesh, spec))
                       for name, (value, _, spec) in LEAVES.items()},
            "step": 0}


def same_bits(name: str, got, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
    assert got.tobytes() == want.tobytes(), f"{name}: loaded bytes differ from the saved ones"


def check_loaded(loaded: dict, mesh: Mesh) -> None:
    assert loaded["step"] == 100, loaded["step"]
    for name, (value, _, spec) in LEAVES.items():
        leaf = loaded["params"][name]
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim), \
            (name, leaf.sharding)
        same_bits(name, leaf, value)


def shardkeep(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(["shardkeep", *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == expect, (
        f"shardkeep {' '.join(map(str, args))} exited with {proc.returncode}, expected "
        f"{expect}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def check_cli(ckpt: pathlib.Path, work: pathlib.Path) -> None:
    info = json.loads(shardkeep("info", ckpt, "--json").stdout)
    [state] = info["checkpointables"]
    leaves = {leaf["path"]: leaf for leaf in state["leaves"]}
    assert set(leaves) == {f"params/{name}" for name in LEAVES} | {"step"}, sorted(leaves)
    assert leaves["step"]["value"] == 100, leaves["step"]
    assert leaves["params/emb"]["dtype"] == "bfloat16", leaves["params/emb"]
    assert leaves["params/w"]["sharding_text"] == "P(data, model) mesh(data=2, model=4)", \
        leaves["params/w"]
    print(shardkeep("info", ckpt).stdout, end="")
    print(shardkeep("verify", ckpt).stdout, end="")

    # verify reads every byte: one flipped byte in a copy is found.
    damaged = work / "damaged"
    shutil.copytree(ckpt, damaged)
    data = sorted((damaged / "state" / "data").glob("*.bin"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    shardkeep("verify", damaged, expect=1)

    # export writes safetensors with the C++ program; convert hands over to
    # this environment's Python package (the launcher names the interpreter).
    shardkeep("export", ckpt, work / "hf", "--format", "safetensors")
    shardkeep("convert", work / "hf", work / "converted", "--from", "safetensors")
    converted = sk.load(work / "converted")
    for name, (value, _, _) in LEAVES.items():
        same_bits(f"converted {name}", converted["params"][name], value)


def main() -> None:
    check_environment()
    devices = np.array(jax.devices())
    save_mesh = Mesh(devices.reshape(2, 4), ("data", "model"))
    load_mesh = Mesh(devices.reshape(4, 2), ("x", "y"))
    state = saved_state(save_mesh)
    work = pathlib.Path(tempfile.mkdtemp(prefix="shardkeep-wheel-"))

    ckpt = work / "ckpt" / "100"
    sk.save(ckpt, state)
    check_loaded(sk.load(ckpt, target_state(load_mesh)), load_mesh)
    step("local save, and load onto another mesh: same bits")

    # One bucket serves every version's check: each its own prefix.
    url = f"s3://{os.environ['SHARDKEEP_CHECK_BUCKET']}/py{sys.version_info[0]}{sys.version_info[1]}/100"
    sk.save_async(url, state).result()
    check_loaded(sk.load(url, target_state(load_mesh)), load_mesh)
    shardkeep("verify", url)
    step(f"S3 save_async, load onto another mesh and `shardkeep verify` ({url}): same bits")

    gs_url = url.replace("s3://", "gs://", 1)
    manager = sk.CheckpointManager(gs_url.rsplit("/", 1)[0] + "/run", keep_last=1)
    manager.save(1, state)
    manager.save(2, state)
    manager.wait()
    assert manager.all_steps() == [2], manager.all_steps()
    check_loaded(manager.load(2, target_state(load_mesh)), load_mesh)
    manager.close()
    shardkeep("ls", gs_url.rsplit("/", 1)[0] + "/run")
    step(f"GCS manager on the emulator, load onto another mesh and `shardkeep ls` ({gs_url}): "
         "same bits")

    check_cli(ckpt, work)
    step("shardkeep info, verify (a damaged copy fails), export and convert")
    shutil.rmtree(work)
    print(f"wheel check passed: shardkeep {sk.__file__}, jax {jax.__version__}, "
          f"numpy {np.__version__}, Python {sys.version.split()[0]}")


START = time.monotonic()
if __name__ == "__main__":
    main()
