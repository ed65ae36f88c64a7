"""The `shardkeep` tool on other formats' checkpoints (docs/CLI.md): convert
finds the source's format itself; the Orbax checkpoints are written by
orbax-checkpoint's own CheckpointManager."""

import os

import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits
from test_cli import FAILED, run

ocp = pytest.importorskip("orbax.checkpoint")


@pytest.fixture(scope="module")
def orbax_root(tmp_path_factory):
    """An Orbax CheckpointManager root with steps 3 and 8, one tree each."""
    root = str(tmp_path_factory.mktemp("orbax") / "run")
    with ocp.CheckpointManager(root) as manager:
        for step in (3, 8):
            manager.save(step, args=ocp.args.StandardSave(
                {"w": np.arange(6, dtype=np.float32) * step, "step": step}))
        manager.wait_until_finished()
    return root


def test_convert_finds_an_orbax_step_without_from(orbax_root, tmp_path):
    dst = tmp_path / "converted"
    run("convert", os.path.join(orbax_root, "8"), dst)
    assert sk.metadata(dst).step == 8
    loaded = sk.load(dst)
    assert_same_bits(loaded["w"], np.arange(6, dtype=np.float32) * 8)
    assert loaded["step"] == 8
    # --from is still taken, and must match what it reads.
    run("convert", os.path.join(orbax_root, "3"), tmp_path / "named", "--from", "orbax")
    assert sk.metadata(tmp_path / "named").step == 3


def test_convert_finds_safetensors_without_from(tmp_path):
    import safetensors.numpy

    safetensors.numpy.save_file({"layer.w": np.ones((2, 3), np.float32)},
                                str(tmp_path / "m.safetensors"))
    run("convert", tmp_path / "m.safetensors", tmp_path / "ckpt")
    assert_same_bits(sk.load(tmp_path / "ckpt")["layer"]["w"], np.ones((2, 3), np.float32))


def test_convert_of_an_orbax_root_names_its_steps(orbax_root, tmp_path):
    failed = run("convert", orbax_root, tmp_path / "out", expect=FAILED)
    assert "root of an Orbax CheckpointManager" in failed.stderr, failed.stderr
    assert "2 step(s): 3, 8" in failed.stderr
    assert not (tmp_path / "out").exists()


def test_convert_of_an_unknown_folder_asks_for_its_format(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "weights.bin").write_bytes(b"\0" * 8)
    failed = run("convert", tmp_path / "src", tmp_path / "out", expect=FAILED)
    assert "found no checkpoint to convert" in failed.stderr, failed.stderr
    assert "--from" in failed.stderr
