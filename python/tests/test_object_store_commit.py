"""The commit on storage without rename, seen from Python.

``memory-objects://`` is the memory backend in its object-store mode (keys
only, no rename, conditional creation), so these tests run the protocol
that S3 uses without a server: each save writes a generation folder that
``_SHARDKEEP`` names, a second save without force is refused, force
replaces, and the manager keeps and cleans up its root.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep import _core

from conftest import assert_same_bits, make_mesh
from record_checksums import write_record

_GENERATION = re.compile(r"\.shardkeep-g[0-9a-f]{16}")


def state(step):
    mesh = make_mesh((2, 4), ("data", "model"))
    w = jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8) + step,
                       NamedSharding(mesh, P("data", "model")))
    return {"params": {"w": w}, "opt_state": {"count": np.int32(step)}}


State = _core.EntryState


def entries(root):
    return {e.name: e.state for e in _core.list_checkpoints(root)}


def data_folder(path):
    return _core.read_commit_record(path).data_folder


@pytest.fixture
def storage_faults():
    yield _core.testing.arm_storage_faults
    _core.testing.disarm_storage_faults()


def test_save_load_replace(tmp_path):
    path = f"memory-objects://{tmp_path.name}/ckpt"
    sk.save(path, state(1), step=1, custom_metadata={"run": "a"})
    first = data_folder(path)
    assert _GENERATION.fullmatch(first)
    assert_same_bits(sk.load(path)["params"]["w"], np.asarray(state(1)["params"]["w"]))
    info = sk.metadata(path)
    assert info.step == 1 and info.custom_metadata == {"run": "a"}
    assert info.commit_record["data_folder"] == first

    with pytest.raises(sk.AlreadyExistsError, match="already committed"):
        sk.save(path, state(2))
    sk.save(path, state(2), force=True)
    second = data_folder(path)
    assert _GENERATION.fullmatch(second) and second != first
    out = sk.load(path, state(0))
    assert_same_bits(out["params"]["w"], np.asarray(state(2)["params"]["w"]))
    assert int(out["opt_state"]["count"]) == 2


def test_the_manager_keeps_and_cleans_an_object_store_root(tmp_path, storage_faults):
    root = f"memory-objects://{tmp_path.name}/run"
    with sk.CheckpointManager(root, keep_last=2, step_width=2) as mgr:
        for step in range(1, 5):
            mgr.save(step, state(step), metrics={"loss": 1.0 / step})
        mgr.wait()
        assert mgr.all_steps() == [3, 4]
        # Step 5 fails at its first data write, and deleting its generation
        # fails too: the step's folder is left unfinished.
        storage_faults([("Append", "", 1, 1, "fail", 0),
                        ("DeleteRecursive", r"/05/\.shardkeep-g[0-9a-f]{16}$", 1, -1, "fail", 0)])
        mgr.save(5, state(5))
        with pytest.raises(sk.StorageError, match="saving step 5 .*injected failure of Append"):
            mgr.wait()
        assert entries(root)["05"] == State.UNFINISHED
        _core.testing.disarm_storage_faults()
        mgr.wait()  # the manager removes it now
        assert entries(root) == {"03": State.COMMITTED, "04": State.COMMITTED}
        mgr.save(6, state(6), metrics={"loss": 0.1})
        mgr.wait()
        assert mgr.all_steps() == [4, 6]
    assert entries(root) == {"04": State.COMMITTED, "06": State.COMMITTED}

    # What a crashed save leaves (a generation and no record) is collected
    # when a manager opens the root.
    sk.save(f"{root}/07/.shardkeep-g0123456789abcdef", state(7))
    assert entries(root)["07"] == State.UNFINISHED
    with sk.CheckpointManager(root, keep_last=2, step_width=2) as mgr:
        assert mgr.all_steps() == [4, 6]
        assert mgr.metrics(6) == {"loss": 0.1}
        assert_same_bits(mgr.load(6)["params"]["w"], np.asarray(state(6)["params"]["w"]))
    assert entries(root) == {"04": State.COMMITTED, "06": State.COMMITTED}


def _move_into_generation(ckpt, generation):
    """Rewrites a POSIX checkpoint into the generation layout of FORMAT.md section 1."""
    (ckpt / generation).mkdir()
    (ckpt / "state").rename(ckpt / generation / "state")
    record = json.loads((ckpt / "_SHARDKEEP").read_text())
    record["data_folder"] = generation
    write_record(ckpt, record)


@pytest.mark.parametrize("map_files", [True, False])
def test_a_bucket_checkpoint_copied_to_a_file_system_loads(tmp_path, map_files):
    # As if downloaded from a bucket: the data sits in the generation the
    # record names, and loading (mapped or read) follows it.
    ckpt = tmp_path / "ckpt"
    sk.save(str(ckpt), state(3))
    _move_into_generation(ckpt, ".shardkeep-g0123456789abcdef")
    out = sk.load(str(ckpt), state(0), options=sk.Options(map_files=map_files))
    assert_same_bits(out["params"]["w"], np.asarray(state(3)["params"]["w"]))
    assert sk.metadata(str(ckpt)).step is None


def test_a_data_folder_leaving_the_checkpoint_is_refused(tmp_path):
    other = tmp_path / "other"
    sk.save(str(other), state(9))
    ckpt = tmp_path / "ckpt"
    sk.save(str(ckpt), state(3))
    record = json.loads((ckpt / "_SHARDKEEP").read_text())
    record["data_folder"] = "../other"
    write_record(ckpt, record)  # its checksum sealed, as a forger's would be
    with pytest.raises(sk.CorruptionError, match="data_folder"):
        sk.load(str(ckpt))
    assert entries(str(tmp_path))["ckpt"] == State.REJECTED
