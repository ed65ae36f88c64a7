"""shardkeep.orbax runs programs written against Orbax's v0 manager API unchanged.

Each test that can runs the same code twice: with ``orbax.checkpoint``
itself and with ``shardkeep.orbax``, only the module object swapped, and
asserts that both give the same values, steps and errors.
"""

import os
import pathlib
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import shardkeep as sk
from conftest import make_mesh
from shardkeep import orbax as sk_ocp
from test_flax_nnx import (AXES, abstract_state, assert_states_equal, batch, build_optimizer,
                           new_model, new_optimizer, train_step)

real_ocp = pytest.importorskip("orbax.checkpoint")
BOTH = pytest.mark.parametrize("ocp", [real_ocp, sk_ocp], ids=["orbax", "shardkeep"])
TOTAL_STEPS = 8


def train(ocp, root, mesh, stop_after=None, kill_after=None):
    """A trainer as it is written against Orbax's v0 manager: resumes from
    the latest step, trains to TOTAL_STEPS saving every second step with
    its loss, and keeps two steps. With ``stop_after`` it stops after that
    step without closing its manager, as a killed job does; with
    ``kill_after`` its process is killed there, a save perhaps in flight.

    Returns ({step: loss} of the steps it trained, its final state).
    """
    model = new_model(mesh)
    optimizer = new_optimizer(model, mesh)
    key = jax.random.key(7)  # a typed key: the trainer's data noise
    options = ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=2)
    mngr = ocp.CheckpointManager(root, options=options, item_names=("state", "progress"))
    start = 0
    if mngr.latest_step() is not None:
        abstract = {"model": abstract_state(mesh),
                    "optimizer": abstract_state(mesh, build_optimizer),
                    "key": jax.ShapeDtypeStruct(key.shape, key.dtype,
                                                sharding=NamedSharding(mesh, PartitionSpec()))}
        restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), progress=ocp.args.JsonRestore()))
        nnx.update(model, restored.state["model"])
        nnx.update(optimizer, restored.state["optimizer"])
        key, start = restored.state["key"], restored.progress["next_step"]
    losses = {}
    for step in range(start, TOTAL_STEPS):
        key, noise = jax.random.split(key)
        x, y = batch(step)
        losses[step] = float(train_step(model, optimizer,
                                        x + 0.01 * jax.random.normal(noise, x.shape), y))
        state = {"model": nnx.state(model), "optimizer": nnx.state(optimizer), "key": key}
        mngr.save(step + 1, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            progress=ocp.args.JsonSave({"next_step": step + 1})), metrics={"loss": losses[step]})
        if step + 1 == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step + 1 == stop_after:
            mngr.wait_until_finished()
            return losses, state  # killed: the manager is never closed
    mngr.close()
    return losses, state


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The losses and final state of the trainer run without a stop, under Orbax."""
    return train(real_ocp, tmp_path_factory.mktemp("uninterrupted"), make_mesh((2, 4), AXES))


def test_a_trainer_resumes_alike_under_orbax_and_shardkeep(tmp_path, uninterrupted):
    mesh = make_mesh((2, 4), AXES)
    expected, expected_state = uninterrupted
    results = {}
    for name, ocp in (("orbax", real_ocp), ("shardkeep", sk_ocp)):
        root = tmp_path / name
        first, _ = train(ocp, root, mesh, stop_after=5)
        resumed, state = train(ocp, root, mesh)  # a new manager on the same root
        with ocp.CheckpointManager(root) as mngr:
            steps = list(mngr.all_steps())
        results[name] = (first, resumed, state, steps)

    for name, (first, resumed, state, steps) in results.items():
        assert first == {s: expected[s] for s in range(5)}, name
        # Saved at 1 (the first step), 2 and 4; the kill lost step 5.
        assert resumed == {s: expected[s] for s in range(4, TOTAL_STEPS)}, name
        assert steps == [6, 8], name
        assert_states_equal(state, expected_state)
    assert_states_equal(results["shardkeep"][2], results["orbax"][2])


@pytest.mark.parametrize("module", ["orbax.checkpoint", "shardkeep.orbax"])
def test_a_killed_trainer_resumes_from_its_last_committed_step(tmp_path, module, uninterrupted):
    root = tmp_path / "run"
    child = (f"import conftest, importlib, test_orbax_dropin as t;"
             f" t.train(importlib.import_module({module!r}), {str(root)!r},"
             f" conftest.make_mesh((2, 4), t.AXES), kill_after=5)")
    run = subprocess.run([sys.executable, "-c", child], cwd=pathlib.Path(__file__).parent,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]

    mesh = make_mesh((2, 4), AXES)
    ocp = real_ocp if module == "orbax.checkpoint" else sk_ocp
    with ocp.CheckpointManager(root) as mngr:
        resumed_from = mngr.latest_step()
    # Saved 1, 2 and 4 (4 perhaps still in flight when killed).
    assert resumed_from in (2, 4)
    expected, expected_state = uninterrupted
    resumed, state = train(ocp, root, mesh)
    assert resumed == {s: expected[s] for s in range(resumed_from, TOTAL_STEPS)}
    assert_states_equal(state, expected_state)


def test_step_folders_are_named_as_orbax_names_them(tmp_path):
    names = {}
    for ocp in (real_ocp, sk_ocp):
        root = tmp_path / ocp.__name__
        for fixed in (None, 4):
            options = ocp.CheckpointManagerOptions(step_format_fixed_length=fixed)
            with ocp.CheckpointManager(root / str(fixed), options=options) as mngr:
                mngr.save(7, args=ocp.args.StandardSave({"a": jnp.arange(3)}))
        names[ocp] = {str(fixed): [p.name for p in (root / str(fixed)).iterdir()
                                   if p.name[0].isdigit()] for fixed in (None, 4)}
    assert names[sk_ocp] == names[real_ocp] == {"None": ["7"], "4": ["0007"]}


@BOTH
def test_one_item_restores_with_and_without_args(ocp, tmp_path):
    tree = {"w": jnp.arange(8.0).reshape(2, 4), "b": jnp.ones(4, jnp.bfloat16)}
    with ocp.CheckpointManager(tmp_path / "run") as mngr:
        assert mngr.save(0, args=ocp.args.StandardSave(tree))
        mngr.wait_until_finished()
        as_saved = mngr.restore(0)
        onto = mngr.restore(None, args=ocp.args.StandardRestore(
            jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                         tree)))
        onto_arrays = mngr.restore(0, args=ocp.args.StandardRestore(tree))
    for got in (as_saved, onto, onto_arrays):
        assert set(got) == {"w", "b"}
        for name in tree:
            np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(tree[name]))
            assert got[name].dtype == tree[name].dtype


@BOTH
def test_composite_with_a_json_item(ocp, tmp_path):
    tree = {"w": jnp.arange(6.0)}
    config = {"lr": 0.01, "layers": [1, 2], "name": "run"}
    with ocp.CheckpointManager(tmp_path / "run", item_names=("params", "config")) as mngr:
        mngr.save(3, args=ocp.args.Composite(params=ocp.args.StandardSave(tree),
                                             config=ocp.args.JsonSave(config)))
        mngr.wait_until_finished()
        everything = mngr.restore(3)
        only_config = mngr.restore(3, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    assert isinstance(everything, ocp.args.Composite)
    assert set(everything.keys()) == {"params", "config"}
    assert everything.config == config and everything["config"] == config
    np.testing.assert_array_equal(np.asarray(everything.params["w"]), np.asarray(tree["w"]))
    assert list(only_config.keys()) == ["config"] and only_config.config == config


@BOTH
def test_partial_restore_reads_the_items_leaves_it_names(ocp, tmp_path):
    tree = {"params": {"w": jnp.arange(4.0)}, "opt": {"mu": jnp.zeros(4)}}
    with ocp.CheckpointManager(tmp_path / "run") as mngr:
        mngr.save(1, args=ocp.args.PyTreeSave(tree))
        mngr.wait_until_finished()
        w = tree["params"]["w"]
        got = mngr.restore(1, args=ocp.args.PyTreeRestore(
            {"params": {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=w.sharding)}},
            partial_restore=True))
    assert set(got) == {"params"}
    np.testing.assert_array_equal(np.asarray(got["params"]["w"]), np.asarray(w))


def _saved_with_metrics(ocp, root, accuracies, **options):
    """Saves one step per accuracy; returns (steps kept, best step)."""
    options = ocp.CheckpointManagerOptions(**options)
    with ocp.CheckpointManager(root, options=options) as mngr:
        for step, accuracy in enumerate(accuracies):
            mngr.save(step, args=ocp.args.StandardSave({"a": jnp.full(2, step)}),
                      metrics={"accuracy": accuracy})
            mngr.wait_until_finished()
        return list(mngr.all_steps()), mngr.best_step()


@pytest.mark.parametrize("mode", ["max", "min"])
def test_best_fn_keeps_the_steps_orbax_keeps(tmp_path, mode):
    accuracies = [0.5, 0.9, 0.1, 0.7, 0.8, 0.3, 0.95, 0.2]
    results = [_saved_with_metrics(ocp, tmp_path / ocp.__name__, accuracies, max_to_keep=3,
                                   best_fn=lambda m: m["accuracy"], best_mode=mode)
               for ocp in (real_ocp, sk_ocp)]
    (orbax_kept, orbax_best), (kept, best) = results
    ranked = sorted(range(len(accuracies)), key=lambda s: accuracies[s],
                    reverse=mode == "max")
    assert sorted(orbax_kept) == sorted(ranked[:3]) and orbax_best == ranked[0]
    # The same best steps; shardkeep also keeps the newest, which it never deletes.
    newest = len(accuracies) - 1
    assert kept == sorted(set(ranked[:3]) | {newest}) and best == ranked[0]


def test_keep_period_and_should_save_answer_as_orbax(tmp_path):
    answers, kept = {}, {}
    for ocp in (real_ocp, sk_ocp):
        options = ocp.CheckpointManagerOptions(save_interval_steps=3, save_on_steps=[4],
                                               max_to_keep=1, keep_period=6,
                                               enable_async_checkpointing=False)
        with ocp.CheckpointManager(tmp_path / ocp.__name__, options=options) as mngr:
            answers[ocp] = [mngr.should_save(s) for s in range(1, 14)
                            if mngr.save(s, args=ocp.args.StandardSave({"a": jnp.ones(1)}))
                            or True]
            kept[ocp] = list(mngr.all_steps())
    assert answers[sk_ocp] == answers[real_ocp]
    assert kept[sk_ocp] == kept[real_ocp]


@BOTH
def test_custom_metadata_is_kept_with_its_step(ocp, tmp_path):
    custom = {"scan_layers": True, "lora": {"rank": 8}}
    with ocp.CheckpointManager(tmp_path / "run") as mngr:
        mngr.save(1, args=ocp.args.StandardSave({"a": jnp.ones(2)}), custom_metadata=custom)
        mngr.save(2, args=ocp.args.StandardSave({"a": jnp.ones(2)}))
        mngr.wait_until_finished()
    with ocp.CheckpointManager(tmp_path / "run") as mngr:
        assert mngr.metadata(1).custom_metadata == custom
        assert mngr.metadata(2).custom_metadata == {}


@BOTH
def test_forcing_a_saved_step_raises_a_value_error(ocp, tmp_path):
    with ocp.CheckpointManager(tmp_path / "run") as mngr:
        mngr.save(2, args=ocp.args.StandardSave({"a": jnp.ones(2)}))
        mngr.wait_until_finished()
        assert not mngr.save(2, args=ocp.args.StandardSave({"a": jnp.ones(2)}))
        with pytest.raises(ValueError, match="2.*already|already.*2"):
            mngr.save(2, args=ocp.args.StandardSave({"a": jnp.ones(2)}), force=True)


# -- what is refused, each by name ----------------------------------------------

def _manager(root, **arguments):
    return sk_ocp.CheckpointManager(root, **arguments)


def _options(**fields):
    return lambda root: _manager(root, options=sk_ocp.CheckpointManagerOptions(**fields))


REFUSED_AT_CREATION = [
    ("checkpointers", lambda root: _manager(root, checkpointers={"a": object()})),
    ("metadata", lambda root: _manager(root, metadata={"version": 1})),
    ("item_handlers", lambda root: _manager(root, item_handlers={"a": object()})),
    ("logger", lambda root: _manager(root, logger=object())),
    ("handler_registry", lambda root: _manager(root, handler_registry=object())),
    ("step_prefix", _options(step_prefix="ckpt")),
    ("step_name_format", _options(step_name_format=object())),
    ("create", _options(create=False)),
    ("single_host_load_and_broadcast", _options(single_host_load_and_broadcast=True)),
    ("todelete_subdir", _options(todelete_subdir="trash")),
    ("todelete_full_path", _options(todelete_full_path="trash/")),
    ("num_deletion_threads", _options(num_deletion_threads=4)),
    ("file_options", _options(file_options=object())),
    ("atomicity_options", _options(atomicity_options=object())),
    ("temporary_path_class", _options(temporary_path_class=object)),
    ("prevent_write_metrics", _options(prevent_write_metrics=True)),
    ("enable_should_save_is_saving_in_progress_check",
     _options(enable_should_save_is_saving_in_progress_check=False)),
    ("enable_per_process_directory_creation", _options(enable_per_process_directory_creation=True)),
    ("lightweight_initialize", _options(lightweight_initialize=True)),
    ("primary_host", _options(multiprocessing_options=real_ocp.options.MultiprocessingOptions(
        primary_host=None))),
    ("active_processes", _options(multiprocessing_options=real_ocp.options.MultiprocessingOptions(
        active_processes={0}))),
    ("barrier_sync_key_prefix", _options(
        multiprocessing_options=real_ocp.options.MultiprocessingOptions(
            barrier_sync_key_prefix="x"))),
    ("barrier_sync_fn", _options(async_options=sk_ocp.AsyncOptions(barrier_sync_fn=print))),
    ("post_finalization_callback",
     _options(async_options=sk_ocp.AsyncOptions(post_finalization_callback=print))),
]


@pytest.mark.parametrize("name,make", REFUSED_AT_CREATION, ids=[n for n, _ in REFUSED_AT_CREATION])
def test_an_unsupported_option_is_refused_by_name(tmp_path, name, make):
    with pytest.raises(sk.InvalidArgumentError,
                       match=rf"\b{name}=.* is not supported by shardkeep\.orbax.*: \w"):
        make(tmp_path / "run")


def test_options_out_of_range_are_refused_by_name(tmp_path):
    with pytest.raises(sk.InvalidArgumentError, match="best_mode must be 'min' or 'max'"):
        sk_ocp.CheckpointManagerOptions(best_mode="best")
    for name in ("max_to_keep", "save_interval_steps", "keep_period"):
        with pytest.raises(sk.InvalidArgumentError,
                           match=rf"CheckpointManagerOptions\.{name} must be an integer >= 1"):
            _options(**{name: 0})(tmp_path / name)


SAVE = sk_ocp.args.StandardSave({"a": jnp.ones(2)})
REFUSED_CALLS = [
    ("items", lambda m: m.save(1, items={"a": jnp.ones(2)}, args=SAVE)),
    ("save_kwargs", lambda m: m.save(1, save_kwargs={}, args=SAVE)),
    ("save_args", lambda m: m.save(1, args=sk_ocp.args.StandardSave({"a": jnp.ones(2)},
                                                                   save_args={"a": object()}))),
    ("custom_metadata", lambda m: m.save(1, args=sk_ocp.args.PyTreeSave(
        {"a": jnp.ones(2)}, custom_metadata={"x": 1}))),
    ("ocdbt_target_data_file_size", lambda m: m.save(1, args=sk_ocp.args.PyTreeSave(
        {"a": jnp.ones(2)}, ocdbt_target_data_file_size=1 << 20))),
    ("items", lambda m: m.restore(0, items={"a": None})),
    ("restore_kwargs", lambda m: m.restore(0, restore_kwargs={})),
    ("directory", lambda m: m.restore(0, directory="/elsewhere")),
    ("strict", lambda m: m.restore(0, args=sk_ocp.args.StandardRestore(strict=False))),
    ("support_layout", lambda m: m.restore(0, args=sk_ocp.args.StandardRestore(
        support_layout=True))),
    ("fallback_sharding", lambda m: m.restore(0, args=sk_ocp.args.StandardRestore(
        fallback_sharding=object()))),
    ("restore_args", lambda m: m.restore(0, args=sk_ocp.args.PyTreeRestore(
        restore_args={"a": object()}))),
    ("transforms", lambda m: m.restore(0, args=sk_ocp.args.PyTreeRestore(transforms={}))),
    ("legacy_transform_fn", lambda m: m.restore(0, args=sk_ocp.args.PyTreeRestore(
        legacy_transform_fn=print))),
    ("read", lambda m: m.all_steps(read=True)),
    ("step", lambda m: m.metadata()),
]


@pytest.mark.parametrize("name,call", REFUSED_CALLS, ids=[n for n, _ in REFUSED_CALLS])
def test_an_unsupported_argument_is_refused_by_name(tmp_path, name, call):
    with _manager(tmp_path / "run") as mngr:
        mngr.save(0, args=SAVE)
        mngr.wait_until_finished()
        with pytest.raises(sk.InvalidArgumentError,
                           match=rf"\b{name}=.* is not supported by shardkeep\.orbax.*: \w"):
            call(mngr)
        assert mngr.all_steps() == [0]  # nothing saved by a refused call


def test_args_shardkeep_cannot_read_are_refused_with_what_to_give(tmp_path):
    with _manager(tmp_path / "run") as mngr:
        with pytest.raises(sk.InvalidArgumentError, match="needs args=: args.StandardSave"):
            mngr.save(0)
        with pytest.raises(sk.InvalidArgumentError,
                           match="Orbax's own StandardSaveArgs .*from shardkeep.orbax.args"):
            mngr.save(0, args=real_ocp.args.StandardSave({"a": jnp.ones(2)}))
        with pytest.raises(sk.InvalidArgumentError,
                           match="Composite item 'a'.*builtins.dict is not saved"):
            mngr.save(0, args=sk_ocp.args.Composite(a={"x": jnp.ones(2)}))
    with _manager(tmp_path / "named", item_names=("state", "meta")) as mngr:
        with pytest.raises(sk.InvalidArgumentError, match=r"items \['other'\] are not among"):
            mngr.save(0, args=sk_ocp.args.Composite(other=SAVE))
        with pytest.raises(sk.InvalidArgumentError,
                           match=r"item_names=\['state', 'meta'\] saves an args.Composite"):
            mngr.save(0, args=SAVE)
        mngr.save(0, args=sk_ocp.args.Composite(state=SAVE, meta=sk_ocp.args.JsonSave({})))
        mngr.wait_until_finished()
        with pytest.raises(sk.InvalidArgumentError, match=r"partial_restore=True .*\['state'\]"):
            mngr.restore(0, args=sk_ocp.args.Composite(
                state=sk_ocp.args.PyTreeRestore(partial_restore=True),
                meta=sk_ocp.args.JsonRestore()))


def test_a_read_only_manager_saves_and_deletes_nothing(tmp_path):
    root = tmp_path / "run"
    _saved_with_metrics(sk_ocp, root, [0.1, 0.2])
    options = sk_ocp.CheckpointManagerOptions(read_only=True, max_to_keep=1)
    with sk_ocp.CheckpointManager(root, options=options) as mngr:
        assert not mngr.should_save(5)
        assert not mngr.save(5, args=SAVE, force=True)
        assert mngr.all_steps() == [0, 1]
        assert mngr.metrics(1) == {"accuracy": 0.2}
