"""A run moved from Orbax to shardkeep resumes: shardkeep's CheckpointManager
on a root that orbax-checkpoint's own CheckpointManager wrote lists its
steps as Orbax steps, restores the latest through the Orbax reader,
continues with steps in shardkeep's format beside them, and never deletes
them."""

import json
import logging
import os
import pathlib
import sys

import jax
import numpy as np
import pytest

import shardkeep as sk
from conftest import make_mesh

ocp = pytest.importorskip("orbax.checkpoint")
pytest.importorskip("flax")

import orbax_trainer  # noqa: E402 - needs orbax and flax, checked above
from test_flax_nnx import AXES, assert_states_equal  # noqa: E402

ORBAX_STEPS = list(range(6))


@pytest.fixture(scope="module")
def orbax_run(tmp_path_factory):
    """Orbax steps 0-5 of a training run and the run itself, which goes on."""
    mesh = make_mesh((2, 4), AXES)
    root = tmp_path_factory.mktemp("orbax_run") / "run"
    run, saved = orbax_trainer.orbax_steps(root, mesh, ORBAX_STEPS)
    return root, mesh, run, saved


def _copy(root, tmp_path):
    """A test's own copy of the Orbax root (the manager writes into it)."""
    import shutil
    shutil.copytree(root, tmp_path / "run")
    return tmp_path / "run"


def _orbax_restore(root, step, target):
    with ocp.CheckpointManager(str(root)) as manager:
        return manager.restore(step, args=ocp.args.StandardRestore(target))


def test_resumes_at_the_latest_orbax_step_and_continues_in_shardkeeps_format(
        orbax_run, tmp_path, caplog):
    root, mesh, run, _ = orbax_run
    root = _copy(root, tmp_path)
    target = orbax_trainer.abstract_training_state(mesh)
    caplog.set_level(logging.INFO, logger="shardkeep")
    with sk.CheckpointManager(root, save_interval_steps=1) as mgr:
        assert mgr.all_steps() == ORBAX_STEPS and mgr.orbax_steps() == ORBAX_STEPS
        assert mgr.latest_step() == 5
        step, state = mgr.restore(target)
        assert step == 5
        # The values Orbax itself restores, typed PRNG keys included.
        assert_states_equal(state, _orbax_restore(root, 5, target))
        kernel = state["params"]["hidden"]["kernel"].get_value()
        assert kernel.sharding == target["params"]["hidden"]["kernel"].sharding

        resumed = orbax_trainer.Run(mesh)
        resumed.update(state)
        losses = []
        for step in range(6, 9):
            losses.append(resumed.train(step))
            assert mgr.save(step, resumed.state())
        mgr.wait()
        assert mgr.all_steps() == ORBAX_STEPS + [6, 7, 8]
        assert mgr.orbax_steps() == ORBAX_STEPS
    # Bit for bit the run that never stopped.
    assert losses == [run.train(step) for step in range(6, 9)]
    assert f"{root} holds Orbax steps {ORBAX_STEPS}: they load through the Orbax reader, are" \
           " never deleted by retention, and new steps are saved in shardkeep's format" \
           in caplog.messages

    with sk.CheckpointManager(root) as mgr:  # reopened: both kinds listed
        assert mgr.all_steps() == ORBAX_STEPS + [6, 7, 8]
        assert mgr.orbax_steps() == ORBAX_STEPS and mgr.latest_step() == 8
        assert sk.metadata(mgr.step_path(8)).step == 8  # shardkeep's format
        assert_states_equal(mgr.load(8, target), resumed.state())
        assert_states_equal(mgr.load(3, target), _orbax_restore(root, 3, target))
    # The Orbax steps are still Orbax's: Orbax lists and restores them.
    with ocp.CheckpointManager(str(root)) as manager:
        assert manager.all_steps() == ORBAX_STEPS


def test_retention_keeps_orbax_steps_out(orbax_run, tmp_path):
    root = _copy(orbax_run[0], tmp_path)
    state = orbax_run[2].state()
    with sk.CheckpointManager(root, keep_last=2, save_interval_steps=1) as mgr:
        for step in (6, 7, 8):
            mgr.save(step, state)
        mgr.wait()
        assert mgr.all_steps() == ORBAX_STEPS + [7, 8]
    for step in ORBAX_STEPS:
        assert (root / str(step) / "_CHECKPOINT_METADATA").is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [str(s) for s in ORBAX_STEPS] + ["000000007", "000000008"])


def test_params_alone_onto_a_new_mesh_through_the_manager(orbax_run, tmp_path):
    root, _, _, saved = orbax_run
    new_mesh = make_mesh((4, 2), AXES)
    target = orbax_trainer.abstract_training_state(new_mesh)
    with sk.CheckpointManager(root) as mgr:
        with pytest.raises(sk.IncompatibleError, match=r"checkpoint leaves not in the target"):
            mgr.load(5, {"params": target["params"]})
        loaded = mgr.load(5, {"params": target["params"]}, partial=True)
    kernel = loaded["params"]["out"]["kernel"].get_value()
    assert kernel.sharding == target["params"]["out"]["kernel"].sharding
    for got, want in zip(jax.tree.leaves(loaded["params"]), jax.tree.leaves(saved[5]["params"])):
        np.testing.assert_array_equal(np.asarray(got), want)


def _composite_root(root, item_names=("state", "extra")):
    values = {"w": np.arange(8.0, dtype=np.float32)}
    with ocp.CheckpointManager(str(root), item_names=item_names) as manager:
        manager.save(3, args=ocp.args.Composite(**{
            item_names[0]: ocp.args.StandardSave(values),
            item_names[1]: ocp.args.JsonSave({"lr": 0.5})}))
        manager.wait_until_finished()
    return values


def test_the_items_of_a_composite_step_are_checkpointables(tmp_path):
    root = tmp_path / "run"
    values = _composite_root(root)
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == [3] and mgr.orbax_steps() == [3]
        np.testing.assert_array_equal(mgr.load()["w"], values["w"])  # "state" alone
        both = mgr.load(3, sk.Checkpointables())
        assert isinstance(both, sk.Checkpointables) and set(both) == {"state", "extra"}
        assert both["extra"] == {"lr": 0.5}
        one = mgr.load(3, sk.Checkpointables(extra=None))
        assert dict(one) == {"extra": {"lr": 0.5}}
        with pytest.raises(sk.InvalidArgumentError) as e:
            mgr.load(3, sk.Checkpointables(extra={"lr": 0.0}))
        assert str(e.value) == (f"Orbax step {root}/3: item 'extra' is a JSON value, which"
                                " takes no target")
        with pytest.raises(sk.NotFoundError) as e:
            mgr.load(3, sk.Checkpointables(params=None))
        assert str(e.value) == (f"Orbax step {root}/3 has no item 'params'; its items, named"
                                " as checkpointables, are ['extra', 'state']")


def test_an_orbax_steps_custom_metadata_is_read(tmp_path):
    root = tmp_path / "run"
    with ocp.CheckpointManager(str(root)) as manager:
        manager.save(2, args=ocp.args.StandardSave({"w": np.arange(4.0)}),
                     custom_metadata={"scan_layers": False, "lora": {"rank": 4}})
        manager.save(3, args=ocp.args.StandardSave({"w": np.arange(4.0)}), force=True)
        manager.wait_until_finished()
    with sk.CheckpointManager(root) as mgr:
        assert mgr.custom_metadata(2) == {"scan_layers": False, "lora": {"rank": 4}}
        assert mgr.custom_metadata(3) == {}


def test_a_step_without_state_names_its_items(tmp_path):
    root = tmp_path / "run"
    _composite_root(root, ("model", "config"))
    with sk.CheckpointManager(root) as mgr:
        with pytest.raises(sk.NotFoundError) as e:
            mgr.load()
    assert str(e.value) == (
        f"Orbax step {root}/3 holds the named checkpointables ['config', 'model'], not one tree"
        " 'state': load them with manager.load(step, sk.Checkpointables(config=..., model=...))")


def test_an_item_shardkeep_cannot_read_is_named_with_its_handler(tmp_path):
    root = tmp_path / "run"
    _composite_root(root)
    step = root / "3"
    metadata = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    metadata["item_handlers"]["blob"] = "some_library.BlobHandler"
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps(metadata))
    (step / "blob").mkdir()
    with sk.CheckpointManager(root) as mgr:
        np.testing.assert_array_equal(mgr.load()["w"], np.arange(8.0))  # the others still load
        with pytest.raises(sk.IncompatibleError) as e:
            mgr.load(3, sk.Checkpointables(blob=None))
    assert str(e.value) == (f"Orbax step {step}: item 'blob' was saved by"
                            " some_library.BlobHandler, which shardkeep cannot read")


def test_prefixed_steps_and_the_metrics_orbax_saved(tmp_path):
    root = tmp_path / "run"
    options = ocp.CheckpointManagerOptions(step_prefix="ckpt", best_fn=lambda m: m["loss"],
                                           best_mode="min")
    with ocp.CheckpointManager(str(root), options=options) as manager:
        for step, loss in ((10, 3.0), (20, 1.0), (30, 2.0)):
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(4, step, np.float32)}),
                         metrics={"loss": loss})
        manager.wait_until_finished()
    with sk.CheckpointManager(root, keep_best=1, best_metric="loss") as mgr:
        assert mgr.all_steps() == [10, 20, 30] and mgr.orbax_steps() == [10, 20, 30]
        assert mgr.metrics(20) == {"loss": 1.0}
        assert mgr.best_step() == 20
        assert mgr.step_path(20) == f"{root}/ckpt_20"
        np.testing.assert_array_equal(mgr.load(20)["w"], np.full(4, 20, np.float32))
        mgr.save(40, {"w": np.zeros(4, np.float32)}, metrics={"loss": 5.0}, force=True)
        mgr.save(50, {"w": np.zeros(4, np.float32)}, metrics={"loss": 4.0}, force=True)
        mgr.wait()
        # Retention ranks shardkeep's steps alone: 40 goes, the Orbax steps stay.
        assert mgr.all_steps() == [10, 20, 30, 50]


def test_a_step_in_both_formats_is_shardkeeps(tmp_path, caplog):
    root = tmp_path / "run"
    with ocp.CheckpointManager(str(root)) as manager:
        manager.save(4, args=ocp.args.StandardSave({"w": np.zeros(2, np.float32)}))
        manager.wait_until_finished()
    sk.save(root / "000000004", {"w": np.ones(2, np.float32)}, step=4)
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == [4] and mgr.orbax_steps() == []
        np.testing.assert_array_equal(mgr.load(4)["w"], np.ones(2, np.float32))
    assert (f"step 4 is in both 000000004 and Orbax's 4; using 000000004"
            in caplog.messages)


def test_a_step_not_committed_names_both_kinds(orbax_run, tmp_path):
    root = _copy(orbax_run[0], tmp_path)
    with sk.CheckpointManager(root, save_interval_steps=1) as mgr:
        mgr.save(6, orbax_run[2].state())
        mgr.wait()
        with pytest.raises(sk.NotFoundError) as e:
            mgr.load(9)
        with pytest.raises(sk.NotFoundError) as metrics_error:
            mgr.metrics(9)
    want = (f"step 9 is not a committed checkpoint under {str(root)!r}; committed steps:"
            f" {ORBAX_STEPS + [6]} (Orbax steps: {ORBAX_STEPS})")
    assert str(e.value) == want and str(metrics_error.value) == want


def test_a_root_without_steps_is_still_empty(tmp_path):
    """An uncommitted Orbax save, or a folder named like a step without
    Orbax's step metadata, is no step."""
    root = tmp_path / "run"
    (root / "5.orbax-checkpoint-tmp-123" / "default").mkdir(parents=True)
    (root / "5.orbax-checkpoint-tmp-123" / "_CHECKPOINT_METADATA").write_text("{}")
    (root / "ckpt_7").mkdir()
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == [] and mgr.restore() is None
        with pytest.raises(sk.NotFoundError) as e:
            mgr.load()
    assert str(e.value) == f"no committed checkpoint under {str(root)!r}"
    assert sorted(p.name for p in root.iterdir()) == ["5.orbax-checkpoint-tmp-123", "ckpt_7"]


def test_every_process_lists_and_restores_the_orbax_steps(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
    import harness
    import interop_scenarios

    root = tmp_path / "run"
    with ocp.CheckpointManager(str(root)) as manager:
        for step in (1, 2):
            manager.save(step, args=ocp.args.StandardSave(interop_scenarios.step_values(step)))
        manager.wait_until_finished()
    results = harness.run_job(2, 4, "interop_scenarios:resume_orbax", {"root": str(root)},
                              timeout=240)
    for result in results:
        assert result == {"listed": [1, 2], "orbax": [1, 2], "restored": 2,
                          "after": [1, 2, 3], "reopened": [1, 2, 3]}
    assert os.path.isdir(root / "1") and os.path.isdir(root / "000000003")


def test_steps_named_like_orbax_on_another_storage_are_not_silent(tmp_path, caplog):
    root = f"memory://{tmp_path.name}/run"
    for name in ("5", "ckpt_7", "notes"):  # folders no shardkeep state describes
        sk.save(f"{root}/{name}/default", {"w": np.zeros(2, np.float32)})
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == []
    assert (f"{root} holds ['5', 'ckpt_7'], named like Orbax steps, which are not listed:"
            " shardkeep reads Orbax checkpoints from a local file system only; to resume from"
            " them, copy the root to one and open the manager there") in caplog.messages


def test_an_orbax_step_with_broken_metadata_is_ignored_and_named(tmp_path, caplog):
    root = tmp_path / "run"
    with ocp.CheckpointManager(str(root)) as manager:
        for step in (1, 2, 3):
            manager.save(step, args=ocp.args.StandardSave({"w": np.zeros(2, np.float32)}))
        manager.wait_until_finished()
    (root / "2" / "_CHECKPOINT_METADATA").write_text("{cut")
    (root / "3" / "_CHECKPOINT_METADATA").write_text("[]")
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == [1]
    warnings = sorted(m for m in caplog.messages if "is ignored" in m)
    assert warnings[0].startswith(f"{root}/2 is ignored: Orbax checkpoint {root}/2:"
                                  " _CHECKPOINT_METADATA is not valid JSON: ")
    assert warnings[1] == (f"{root}/3 is ignored: Orbax checkpoint {root}/3:"
                           " _CHECKPOINT_METADATA is not a JSON object")


def test_a_json_item_of_several_files_is_corruption(tmp_path):
    root = tmp_path / "run"
    _composite_root(root)
    (root / "3" / "extra" / "stray.json").write_text("{}")
    with sk.CheckpointManager(root) as mgr:
        with pytest.raises(sk.CorruptionError) as e:
            mgr.load(3, sk.Checkpointables(extra=None))
    assert str(e.value) == (f"Orbax checkpoint {root}/3/extra: a JSON item holds one file,"
                            " this holds ['metadata', 'stray.json']")


def test_the_drop_in_resumes_a_root_orbax_wrote(tmp_path):
    """Changing the import moves a run with its steps: shardkeep.orbax's
    manager is shardkeep's, and resumes alike."""
    from shardkeep import orbax as drop_in

    root = str(tmp_path / "run")
    with ocp.CheckpointManager(root) as manager:
        for step in ORBAX_STEPS:
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(3, step, np.float32)}))
        manager.wait_until_finished()
    options = drop_in.CheckpointManagerOptions(max_to_keep=2)
    with drop_in.CheckpointManager(root, options=options) as manager:
        assert manager.latest_step() == 5
        restored = manager.restore(5, args=drop_in.args.StandardRestore(
            {"w": np.zeros(3, np.float32)}))
        np.testing.assert_array_equal(restored["w"], np.full(3, 5, np.float32))
        for step in (6, 7, 8):
            manager.save(step, args=drop_in.args.StandardSave({"w": np.full(3, step, np.float32)}))
        manager.wait_until_finished()
        assert manager.all_steps() == ORBAX_STEPS + [7, 8]
