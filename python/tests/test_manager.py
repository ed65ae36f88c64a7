"""CheckpointManager: schedule, retention on disk, discovery, loading, error surfacing."""

import json
import logging
import os
import pathlib
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from shardkeep.manager import checkpoint_manager as manager_lib

from conftest import assert_same_bits, make_mesh
from record_checksums import write_record


def state(step):
    """A small sharded training state whose values depend on ``step``."""
    mesh = make_mesh((2, 4), ("data", "model"))
    w = jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8) + step,
                       NamedSharding(mesh, P("data", "model")))
    return {"params": {"w": w}, "opt_state": {"count": np.int32(step)}}


def on_disk(root):
    return sorted(os.listdir(root))


State = _core.EntryState


def entries(root):
    """{name: state} under ``root`` (any backend), as the core classifies them."""
    return {e.name: e.state for e in _core.list_checkpoints(str(root))}


@pytest.fixture
def storage_faults():
    """Arms storage faults in this process (see storage/process_faults.h); disarms after."""
    yield _core.testing.arm_storage_faults
    _core.testing.disarm_storage_faults()


def test_interval_and_force_decide_what_is_saved(tmp_path):
    with sk.CheckpointManager(tmp_path, save_interval_steps=5, step_width=4) as mgr:
        saved = [step for step in range(13) if mgr.save(step, state(step))]
        assert saved == [0, 5, 10]
        assert mgr.save(12, state(12)) is False
        assert mgr.save(13, state(13), force=True) is True
        mgr.wait()
        assert mgr.all_steps() == [0, 5, 10, 13]
        assert mgr.latest_step() == 13
    assert on_disk(tmp_path) == ["0000", "0005", "0010", "0013"]


def test_a_step_not_after_the_last_saved_one_is_skipped(tmp_path):
    with sk.CheckpointManager(tmp_path) as mgr:
        assert mgr.save(4, state(4))
        assert mgr.save(4, state(4), force=True) is False
        assert mgr.save(3, state(3)) is False
    with sk.CheckpointManager(tmp_path) as mgr:
        assert mgr.save(4, state(4)) is False
        assert mgr.save(5, state(5))


def test_next_save_waits_for_the_previous_commit(tmp_path):
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
        assert 1 in mgr.all_steps()  # committed before save 2 started
        assert mgr._in_flight.commit.step == 2
        mgr.wait()
        assert mgr.all_steps() == [1, 2]


def test_the_manager_runs_no_thread_of_its_own(tmp_path):
    before = set(threading.enumerate())
    with sk.CheckpointManager(tmp_path, keep_last=1) as mgr:
        for step in range(3):
            mgr.save(step, state(step))
        # Commits, retention and deletions ran on the save queue's thread.
        mgr.wait()
        assert mgr.all_steps() == [2] and on_disk(tmp_path) == ["000000002"]
        assert set(threading.enumerate()) == before


def test_sync_save_returns_after_the_commit(tmp_path):
    with sk.CheckpointManager(tmp_path, async_save=False) as mgr:
        mgr.save(7, state(7))
        assert mgr.all_steps() == [7]
        assert sk.metadata(mgr.step_path(7)).step == 7


def test_metrics_are_stored_in_the_commit_record(tmp_path):
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state(1), metrics={"loss": np.float32(0.5), "acc": jnp.array(3),
                                       "bad": float("nan"), "note": "x"})
        mgr.wait()
        expected = {"loss": 0.5, "acc": 3, "bad": None, "note": "x"}
        assert mgr.metrics(1) == expected
        assert sk.metadata(mgr.step_path(1)).metrics == expected
        with pytest.raises(sk.InvalidArgumentError, match="metrics"):
            mgr.save(2, state(2), metrics={"loss": object()})
    with sk.CheckpointManager(tmp_path) as mgr:
        assert mgr.metrics(1) == expected


def test_custom_metadata_is_kept_in_the_commit_record(tmp_path):
    custom = {"scan_layers": True, "lora": {"rank": 8, "targets": ["q", "v"]}}
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, state(1), custom_metadata=custom)
        mgr.save(2, state(2))
        mgr.wait()
        assert mgr.custom_metadata(1) == custom
        assert mgr.custom_metadata(2) == {}
        assert sk.metadata(mgr.step_path(1)).custom_metadata == custom
    with sk.CheckpointManager(tmp_path) as mgr:
        assert mgr.custom_metadata(1) == custom
        with pytest.raises(sk.NotFoundError, match="3"):
            mgr.custom_metadata(3)


def test_custom_metadata_is_checked_before_anything_is_saved(tmp_path):
    with sk.CheckpointManager(tmp_path, save_interval_steps=10) as mgr:
        with pytest.raises(sk.InvalidArgumentError,
                           match=r"custom_metadata must be a mapping, got list"):
            mgr.save(1, state(1), custom_metadata=["x"])
        # Refused on a step that is not due too: the error shows at once.
        with pytest.raises(sk.InvalidArgumentError,
                           match=r"keys \['shardkeep_local'\] are reserved.*rename them"):
            mgr.save(1, state(1), custom_metadata={"shardkeep_local": 1, "lr": 0.1})
        with pytest.raises(sk.InvalidArgumentError, match="not JSON-serialisable"):
            mgr.save(10, state(10), custom_metadata={"lr": object()})
        mgr.wait()
        assert mgr.all_steps() == []


def test_keep_last_deletes_older_steps_on_disk(tmp_path):
    with sk.CheckpointManager(tmp_path, keep_last=2, step_width=3) as mgr:
        for step in range(1, 6):
            mgr.save(step, state(step))
        mgr.wait()
        assert mgr.all_steps() == [4, 5]
    assert on_disk(tmp_path) == ["004", "005"]


def test_keep_every_steps_and_best_combined_on_disk(tmp_path):
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 2.0, 7: 7.0, 8: 8.0, 9: 9.0}
    with sk.CheckpointManager(tmp_path, keep_last=1, keep_every_steps=4, keep_best=2,
                              best_metric="loss", step_width=1) as mgr:
        for step, loss in losses.items():
            mgr.save(step, state(step), metrics={"loss": loss})
        mgr.wait()
        assert mgr.all_steps() == [2, 4, 6, 8, 9]  # best 2, 6; every 4th; last 9
        assert mgr.best_step() == 2
    assert on_disk(tmp_path) == ["2", "4", "6", "8", "9"]


def test_best_max_and_steps_without_the_metric(tmp_path):
    with sk.CheckpointManager(tmp_path, keep_best=1, best_metric="acc", best_mode="max") as mgr:
        mgr.save(1, state(1), metrics={"acc": 0.9})
        mgr.save(2, state(2), metrics={"acc": 0.5})
        mgr.save(3, state(3))  # no metric: kept only while it is the latest
        mgr.wait()
        assert mgr.all_steps() == [1, 3]
        mgr.save(4, state(4), metrics={"acc": 0.1})
        mgr.wait()
        assert mgr.all_steps() == [1, 4]
        assert mgr.best_step() == 1


def test_retention_applies_to_steps_found_at_start(tmp_path):
    with sk.CheckpointManager(tmp_path) as mgr:
        for step in range(1, 5):
            mgr.save(step, state(step))
    with sk.CheckpointManager(tmp_path, keep_last=2) as mgr:
        assert mgr.all_steps() == [1, 2, 3, 4]  # nothing is deleted before a commit
        mgr.save(5, state(5))
        mgr.wait()
        assert mgr.all_steps() == [4, 5]


def test_discovery_ignores_uncommitted_and_removes_stale_temporaries(tmp_path, caplog):
    with sk.CheckpointManager(tmp_path, step_width=2) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    (tmp_path / "03").mkdir()                           # copied in, not committed: kept
    (tmp_path / "03" / "params").mkdir()
    (tmp_path / "04.shardkeep-tmp").mkdir()             # crashed save: removed
    (tmp_path / "05.shardkeep-deleting").mkdir()        # crashed deletion: removed
    (tmp_path / "01.shardkeep-old").mkdir()             # replaced and committed: removed
    (tmp_path / "09.shardkeep-old").mkdir()             # only copy of step 9: kept
    (tmp_path / "notes").mkdir()
    (tmp_path / "06").mkdir()
    (tmp_path / "06" / "_SHARDKEEP").write_text("{trunc")  # does not parse: ignored
    with caplog.at_level(logging.WARNING, logger="shardkeep"):
        with sk.CheckpointManager(tmp_path, step_width=2) as mgr:
            assert mgr.all_steps() == [1, 2]
            assert mgr.latest_step() == 2
    assert on_disk(tmp_path) == ["01", "02", "03", "06", "09.shardkeep-old", "notes"]
    assert "09.shardkeep-old: it holds the only copy of" in caplog.text
    assert "06 is ignored" in caplog.text


def test_load_latest_a_step_or_one_checkpointable(tmp_path):
    mesh = make_mesh((4, 2), ("a", "b"))
    with sk.CheckpointManager(tmp_path) as mgr:
        with pytest.raises(sk.NotFoundError, match="no committed checkpoint"):
            mgr.load()
        for step in (1, 2):
            mgr.save(step, sk.Checkpointables(state(step), data=sk.JsonValue({"next": step})))
        mgr.wait()
        everything = mgr.load(target=sk.Checkpointables())
        assert isinstance(everything, sk.Checkpointables)
        assert everything["data"] == {"next": 2}
        assert_same_bits(everything["params"]["w"], np.asarray(state(2)["params"]["w"]))
        target = {"params": {"w": jax.ShapeDtypeStruct(
            (8, 8), jnp.float32, sharding=NamedSharding(mesh, P(None, "a")))}}
        # Loading "params" reads nothing of the other checkpointables.
        os.rename(os.path.join(mgr.step_path(1), "opt_state"), tmp_path / "elsewhere")
        params = mgr.load(1, sk.Checkpointables(target))
        assert set(params) == {"params"}
        assert params["params"]["w"].sharding == target["params"]["w"].sharding
        assert_same_bits(params["params"]["w"], np.asarray(state(1)["params"]["w"]))
        with pytest.raises(sk.NotFoundError, match="committed steps: \\[1, 2\\]"):
            mgr.load(3)


def test_a_value_means_the_same_to_sk_save_and_the_manager(tmp_path):
    """A plain dict is one tree, "state", for both; sk.Checkpointables is
    named parts for both; sk.load on a manager's checkpoint loads "state",
    or, on one of named parts, says exactly what to call."""
    tree = {"params": np.arange(4.0), "opt": {"mu": np.ones(2)}}
    parts = sk.Checkpointables(params=np.arange(4.0), data=sk.JsonValue({"next": 2}))
    sk.save(tmp_path / "tree", tree)
    sk.save(tmp_path / "parts", parts)
    with sk.CheckpointManager(tmp_path / "run") as mgr:
        mgr.save(1, tree)
        mgr.save(2, parts)
        mgr.wait()
        for path, step in ((tmp_path / "tree", 1), (tmp_path / "parts", 2)):
            assert (sorted(sk.metadata(path).checkpointables)
                    == sorted(sk.metadata(mgr.step_path(step)).checkpointables))
        assert sorted(sk.metadata(mgr.step_path(1)).checkpointables) == ["state"]
        assert sorted(sk.metadata(mgr.step_path(2)).checkpointables) == ["data", "params"]
        for loaded in (sk.load(mgr.step_path(1)), mgr.load(1), sk.load(tmp_path / "tree")):
            assert sorted(loaded) == ["opt", "params"]
            assert_same_bits(loaded["params"], tree["params"])
        path = mgr.step_path(2)
        expected = (f"checkpoint {path!r} holds the named checkpointables ['data', 'params'],"
                    f" not one tree 'state': load them with sk.load_checkpointables({path!r})"
                    " (all, or a mapping of name to target) or"
                    f" sk.load({path!r}, sk.Checkpointables(data=..., params=...))")
        for load in (lambda: sk.load(path), lambda: mgr.load(2)):
            with pytest.raises(sk.NotFoundError) as e:
                load()
            assert str(e.value) == expected
        assert sk.load(path, sk.Checkpointables(data=None)) == {"data": {"next": 2}}
        assert mgr.load(2, sk.Checkpointables(data=None)) == {"data": {"next": 2}}
        assert sk.load_checkpointables(path, {"data": None}) == {"data": {"next": 2}}
    with pytest.raises(sk.InvalidArgumentError, match="leaf 'data' is a JsonValue.*"
                       r"sk\.Checkpointables\(\.\.\.\)"):
        sk.save(tmp_path / "mixed", {"params": np.arange(2), "data": sk.JsonValue(1)})


def test_checkpointables_is_an_immutable_mapping():
    parts = sk.Checkpointables({"a": 1}, b=2)
    assert dict(parts) == {"a": 1, "b": 2} and parts == {"a": 1, "b": 2}
    with pytest.raises(TypeError):
        parts["c"] = 3
    with pytest.raises(AttributeError):
        parts.extra = 1


def test_a_tree_that_is_not_a_mapping_is_saved_as_state(tmp_path):
    tree = (jnp.ones((4,)), [np.int64(3)])
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, tree)
        mgr.wait()
        assert list(sk.metadata(mgr.step_path(1)).checkpointables) == ["state"]
        restored = mgr.load(1, (np.zeros((4,), np.float32), [np.int64(0)]))
        assert isinstance(restored, tuple)
        assert_same_bits(restored[0], np.ones((4,), np.float32))


def test_a_step_being_loaded_is_deleted_only_after_the_load(tmp_path, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real_load = manager_lib.load

    def slow_load(*args, **kwargs):
        entered.set()
        assert release.wait(30)
        return real_load(*args, **kwargs)

    with sk.CheckpointManager(tmp_path, keep_last=1) as mgr:
        mgr.save(1, state(1))
        mgr.wait()
        monkeypatch.setattr(manager_lib, "load", slow_load)
        result = {}
        loader = threading.Thread(target=lambda: result.update(mgr.load(1)))
        loader.start()
        assert entered.wait(30)
        mgr.save(2, state(2))
        mgr.wait()
        assert mgr.all_steps() == [2]               # dropped from the record at once
        assert os.path.isdir(mgr.step_path(1))      # but still on disk while loading
        release.set()
        loader.join(30)
        mgr.wait()
        assert not os.path.exists(mgr.step_path(1))
        assert_same_bits(result["params"]["w"], np.asarray(state(1)["params"]["w"]))


class FailedFuture:
    """A save whose background phase has failed."""

    def __init__(self, path):
        self.path = path

    def result(self, timeout=None):
        raise sk.StorageError(f"disk full while writing {self.path}/params/data/p0-0.bin")

    def done(self):
        return True

    def wait_for_end(self, timeout=None):
        return True


def failing_start_save(path, *args, on_finished, **kwargs):
    """``start_save`` of a save that fails in the background: its end, as the
    save queue reports it, runs before the call returns."""
    future = FailedFuture(path)
    on_finished(f"disk full while writing {path}/params/data/p0-0.bin", None)
    return future


def test_a_failed_background_save_raises_on_the_next_save(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(manager_lib, "start_save", failing_start_save)
    mgr = sk.CheckpointManager(tmp_path, save_interval_steps=10)
    with caplog.at_level(logging.ERROR, logger="shardkeep"):
        assert mgr.save(10, state(10))
    assert "saving step 10" in caplog.text and "disk full" in caplog.text
    with pytest.raises(sk.StorageError, match="saving step 10 .* failed: disk full") as info:
        mgr.save(11, state(11))  # not due, yet the error surfaces
    assert isinstance(info.value.__cause__, sk.StorageError)
    assert mgr.save(12, state(12)) is False  # raised once, not again
    assert mgr.all_steps() == []
    mgr.close()


def test_a_failed_background_save_raises_on_wait_and_close(tmp_path, monkeypatch):
    monkeypatch.setattr(manager_lib, "start_save", failing_start_save)
    mgr = sk.CheckpointManager(tmp_path)
    mgr.save(1, state(1))
    with pytest.raises(sk.StorageError, match="step 1"):
        mgr.wait()
    mgr.save(2, state(2))  # the failed step 1 does not block later steps
    with pytest.raises(sk.StorageError, match="step 2"):
        mgr.close()
    with pytest.raises(sk.InvalidArgumentError, match="closed"):
        mgr.save(3, state(3))


def test_a_real_failed_save_surfaces(tmp_path):
    # A non-empty, uncommitted directory at the step's path is refused by the core.
    (tmp_path / "000000002").mkdir()
    (tmp_path / "000000002" / "someone.txt").write_text("data")
    mgr = sk.CheckpointManager(tmp_path)
    mgr.save(1, state(1))
    with pytest.raises(sk.ShardkeepError, match="000000002"):
        mgr.save(2, state(2))
        mgr.wait()
    mgr.close()
    assert mgr.all_steps() == [1]


def test_a_failed_deletion_surfaces(tmp_path, storage_faults):
    mgr = sk.CheckpointManager(tmp_path, keep_last=1)
    # The deletion's rename of 000000001 to 000000001.shardkeep-deleting fails.
    storage_faults([("Rename", "/000000001$", 1, -1, "fail", 0)])
    mgr.save(1, state(1))
    mgr.save(2, state(2))
    with pytest.raises(sk.StorageError, match="deleting step 1 .*injected failure of Rename"):
        mgr.close()
    assert on_disk(tmp_path) == ["000000001", "000000002"]


def test_records_the_core_rejects_are_not_committed(tmp_path, caplog):
    with sk.CheckpointManager(tmp_path, step_width=2) as mgr:
        for step in (1, 2, 3, 4):
            mgr.save(step, state(step))
    def edit(name, change):
        record = json.loads((tmp_path / name / "_SHARDKEEP").read_text())
        change(record)
        write_record(tmp_path / name, record)  # its checksum sealed: only the change counts
    edit("02", lambda r: r.update(version=99))              # a newer shardkeep's
    edit("03", lambda r: r.pop("process_count"))            # valid JSON, not a record
    edit("04", lambda r: r.update(format="orbax"))          # someone else's
    with caplog.at_level(logging.WARNING, logger="shardkeep"):
        with sk.CheckpointManager(tmp_path, step_width=2, keep_last=1) as mgr:
            assert mgr.all_steps() == [1]
            assert mgr.latest_step() == 1
            with pytest.raises(sk.NotFoundError):
                mgr.load(2)
            mgr.save(5, state(5))
            mgr.wait()
            assert mgr.all_steps() == [5]
    assert "02 is ignored" in caplog.text and "newer shardkeep" in caplog.text
    assert "03 is ignored" in caplog.text and "process_count" in caplog.text
    # Not the manager's to delete: they are not its checkpoints, nor garbage.
    assert on_disk(tmp_path) == ["02", "03", "04", "05"]


@pytest.mark.parametrize("backend", ["file", "memory"])
def test_a_failed_save_leaves_nothing_behind(tmp_path, storage_faults, backend):
    root = str(tmp_path) if backend == "file" else f"memory://{tmp_path.name}/run"
    with sk.CheckpointManager(root, keep_last=1) as mgr:
        mgr.save(1, state(1))
        mgr.wait()
        # Step 2's save fails at its first data write, and any removal of its
        # temporary folder after the failure fails too (as on a full or
        # failing disk), so only the manager can clean up.
        storage_faults([("Append", "", 1, 1, "fail", 0),
                        ("DeleteRecursive", r"000000002\.shardkeep-tmp$", 2, -1, "fail", 0),
                        ("Rename", r"000000002\.shardkeep-tmp$", 1, -1, "fail", 0)])
        mgr.save(2, state(2))
        with pytest.raises(sk.StorageError, match="saving step 2 .*injected failure of Append"):
            mgr.wait()
        assert "000000002.shardkeep-tmp" in entries(root)   # could not be removed yet
        _core.testing.disarm_storage_faults()
        mgr.wait()                                           # now it can
        assert entries(root) == {"000000001": State.COMMITTED}
        assert mgr.save(3, state(3))
        mgr.wait()
        assert mgr.all_steps() == [3]
        assert_same_bits(mgr.load(3)["params"]["w"], np.asarray(state(3)["params"]["w"]))
    assert entries(root) == {"000000003": State.COMMITTED}


def test_the_manager_removes_the_leftover_of_a_failed_start(tmp_path, storage_faults):
    with sk.CheckpointManager(tmp_path) as mgr:
        # The core's start of the save (on the starter thread) fails after
        # creating the temporary folder, and the save's own removal of it
        # (its second DeleteRecursive there, after the removal of a stale
        # one) fails too; the error surfaces on the manager's next call.
        storage_faults([("CreateDir", r"000000001\.shardkeep-tmp/state", 1, 1, "fail", 0),
                        ("DeleteRecursive", r"000000001\.shardkeep-tmp$", 2, 1, "fail", 0)])
        mgr.save(1, state(1))
        with pytest.raises(sk.StorageError, match="injected failure of CreateDir"):
            mgr.wait()  # removes the leftover, then raises the save's error
        _core.testing.disarm_storage_faults()
        assert on_disk(tmp_path) == []
        mgr.save(2, state(2))
        mgr.wait()
    assert on_disk(tmp_path) == ["000000002"]


def test_close_is_idempotent_and_the_context_keeps_the_first_error(tmp_path, monkeypatch):
    monkeypatch.setattr(manager_lib, "start_save", failing_start_save)
    with pytest.raises(KeyError):
        with sk.CheckpointManager(tmp_path) as mgr:
            mgr.save(1, state(1))
            raise KeyError("training failed")
    mgr.close()


@pytest.mark.parametrize("kwargs", [{"save_interval_steps": 0}, {"step_width": 0},
                                    {"keep_best": 1}, {"best_mode": "up"}])
def test_invalid_arguments(tmp_path, kwargs):
    with pytest.raises(sk.InvalidArgumentError):
        sk.CheckpointManager(tmp_path, **kwargs)


def test_file_urls_and_unknown_schemes(tmp_path):
    with sk.CheckpointManager(f"file://{tmp_path}/run") as mgr:
        mgr.save(1, state(1), force=True)
    assert json.loads((tmp_path / "run" / "000000001" / "_SHARDKEEP").read_text())["step"] == 1
    with pytest.raises(sk.InvalidArgumentError, match="unknown scheme"):
        sk.CheckpointManager("nosuch://ckpts")


def test_memory_roots_work_like_file_roots(tmp_path):
    root = f"memory://{tmp_path.name}/run"
    with sk.CheckpointManager(root, keep_last=2, step_width=2) as mgr:
        for step in range(1, 5):
            mgr.save(step, state(step), metrics={"loss": 1.0 / step})
        mgr.wait()
        assert mgr.all_steps() == [3, 4]
        assert mgr.step_path(4) == f"{root}/04"
    assert entries(root) == {"03": State.COMMITTED, "04": State.COMMITTED}
    # Leftovers of crashed saves and deletions are collected at start.
    sk.save(f"{root}/05.shardkeep-tmp", state(5)["params"])
    sk.save(f"{root}/03.shardkeep-deleting", state(3)["params"])
    with sk.CheckpointManager(root, keep_last=2, step_width=2) as mgr:
        assert mgr.all_steps() == [3, 4]
        assert mgr.metrics(4) == {"loss": 0.25}
        assert_same_bits(mgr.load(3)["params"]["w"], np.asarray(state(3)["params"]["w"]))
    assert entries(root) == {"03": State.COMMITTED, "04": State.COMMITTED}


def test_two_processes_make_the_same_decisions(tmp_path):
    multiprocess = pathlib.Path(__file__).with_name("multiprocess")
    sys.path.insert(0, str(multiprocess))
    import harness

    results = harness.run_job(2, 4, "manager_scenarios:manager_job",
                              {"root": str(tmp_path / "run")}, timeout=120)
    for result in results:
        assert result["saved"] == [2, 4, 5, 6, 8, 10]
        assert result["steps"] == result["reopened"] == [4, 8, 10]
        assert result["best"] == 4
        assert result["exact"]
        assert result["source"] == "jax"
        assert result["preempted_steps"] == [result["preempted_at"]]
    assert results[0]["on_disk"] == ["000000004", "000000008", "000000010"]
    assert results[0]["preempted_at"] == results[1]["preempted_at"] >= 5


def test_the_core_tells_local_paths_from_urls(tmp_path):
    # One rule (the core's Location) for the manager, the local tier and load.
    assert _core.Location(f"file://{tmp_path}/").local_path == str(tmp_path)
    assert _core.Location(f"{tmp_path}/a://b").scheme == "file"  # no scheme before "://"
    for url in ("s3://bucket/run", "gs://bucket/run", "memory://run"):
        assert _core.Location(url).local_path is None
    with pytest.raises(sk.InvalidArgumentError, match="unknown scheme 'az'"):
        _core.Location("az://bucket/run")
    with sk.CheckpointManager(f"file://{tmp_path}/run/") as mgr:
        mgr.save(1, state(1))
    with sk.CheckpointManager(tmp_path / "run") as mgr:
        assert mgr.all_steps() == [1]
    with pytest.raises(sk.InvalidArgumentError, match="local_root must be a path"):
        sk.CheckpointManager(tmp_path / "p", local_root="memory://local{process}",
                             local_save_interval_steps=1)


def test_unchanged_arrays_are_linked_by_every_process_of_a_job(tmp_path):
    """4 processes: each links its own shards of the frozen array from the
    previous step; retention deletes steps others link; the last step loads
    exactly onto another sharding."""
    multiprocess = pathlib.Path(__file__).with_name("multiprocess")
    sys.path.insert(0, str(multiprocess))
    import harness

    results = harness.run_job(4, 2, "manager_scenarios:unchanged_job",
                              {"root": str(tmp_path / "run")}, timeout=180)
    for result in results:
        assert result["steps"] == [3, 4]
        assert result["exact"]
    linked = results[0]["linked"]
    assert sorted(int(step) for step in linked) == [2, 3, 4]
    assert all(size >= results[0]["frozen_bytes"] for size in linked.values())
