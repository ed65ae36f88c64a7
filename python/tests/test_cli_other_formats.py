"""The `shardkeep` tool on other formats' checkpoints (docs/CLI.md): convert
finds the source's format itself; ls, info, verify and diff say what an
Orbax or DCP checkpoint is (read-only) and how to read it. The Orbax
checkpoints are written by orbax-checkpoint's own CheckpointManager."""

import os

import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits
from test_cli import FAILED, run, run_json

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


def test_ls_describes_orbax_steps_as_read_only(orbax_root):
    listing = run("ls", orbax_root).stdout
    for step in (3, 8):
        assert f"orbax step {step}, read-only" in listing, listing
    assert "not a checkpoint" not in listing
    assert "2 Orbax or DCP checkpoints, read-only" in listing
    entries = run_json("ls", orbax_root)["entries"]
    assert [(e["name"], e["format"], e["step"]) for e in entries] == [
        ("3", "orbax", 3), ("8", "orbax", 8)]


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_on_an_orbax_step_say_what_it_is(orbax_root, command):
    step = os.path.join(orbax_root, "8")
    failed = run(command, step, expect=FAILED)
    assert "_SHARDKEEP" not in failed.stderr, failed.stderr
    assert f"{step} is an Orbax checkpoint (CheckpointManager step 8)" in failed.stderr
    assert f"`shardkeep {command}` works on shardkeep checkpoints" in failed.stderr
    assert f"shardkeep.load_orbax('{step}', target)" in failed.stderr
    assert f"`shardkeep convert {step} DST`" in failed.stderr


def test_info_on_an_orbax_root_names_its_steps(orbax_root):
    failed = run("info", orbax_root, expect=FAILED)
    assert "the root of an Orbax CheckpointManager (2 step(s): 3, 8)" in failed.stderr, \
        failed.stderr
    assert f"`shardkeep ls {orbax_root}` lists its steps" in failed.stderr


def test_diff_names_the_format_of_each_side_it_cannot_compare(orbax_root, tmp_path):
    sk.save(tmp_path / "native", {"w": np.zeros(6, np.float32), "step": 0})
    step = os.path.join(orbax_root, "3")
    failed = run("diff", step, tmp_path / "native", expect=FAILED)
    assert f"shardkeep diff: {step} is an Orbax checkpoint" in failed.stderr, failed.stderr
    assert str(tmp_path / "native") + " is" not in failed.stderr


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_info_and_ls_on_a_dcp_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    path = tmp_path / "run" / "dcp"
    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(path))
    failed = run("info", path, expect=FAILED)
    assert f"{path} is a PyTorch DCP checkpoint" in failed.stderr, failed.stderr
    assert "allow_pickle=True" in failed.stderr and "--allow-pickle" in failed.stderr
    assert "PyTorch DCP checkpoint, read-only" in run("ls", path.parent).stdout
