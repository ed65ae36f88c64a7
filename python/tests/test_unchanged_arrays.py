"""Saves that take unchanged arrays from an earlier checkpoint (``base=``,
and the manager's latest step): linked, not written; every checkpoint
whole on its own; never taken from a checkpoint they are not in."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from conftest import assert_same_bits, make_mesh

ROWS, COLS = 512, 1024  # 2 MiB of float32: large enough to be remembered


def sharded(values, mesh):
    return jax.device_put(values, NamedSharding(mesh, P("x", None)))


@pytest.fixture
def mesh():
    return make_mesh((8,), ("x",))


@pytest.fixture
def state(mesh):
    rng = np.random.default_rng(0)
    return {"frozen": sharded(rng.normal(size=(ROWS, COLS)).astype(np.float32), mesh),
            "adapter": sharded(rng.normal(size=(ROWS, 8)).astype(np.float32), mesh)}


def data_files(checkpoint):
    folder = os.path.join(checkpoint, "state", "data")
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder))]


def shared_with(checkpoint, earlier) -> int:
    """Bytes of ``checkpoint``'s data files that are files of ``earlier``."""
    inodes = {os.stat(f).st_ino for f in data_files(earlier)}
    return sum(os.stat(f).st_size for f in data_files(checkpoint)
               if os.stat(f).st_ino in inodes)


def written(checkpoint) -> int:
    """Bytes of ``checkpoint``'s data files that no other name shares."""
    return sum(os.stat(f).st_size for f in data_files(checkpoint) if os.stat(f).st_nlink == 1)


def assert_loads(checkpoint, expected):
    loaded = sk.load(checkpoint, jax.tree.map(lambda a: a, expected))
    for name in expected:
        assert_same_bits(loaded[name], expected[name])


def test_an_unchanged_array_is_linked_and_survives_its_base(tmp_path, state, mesh):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sk.save(a, state)
    state = {**state, "adapter": state["adapter"] + 1}  # the adapter trains, the rest is frozen
    sk.save(b, state, base=a)

    frozen_bytes = state["frozen"].nbytes
    assert shared_with(b, a) >= frozen_bytes
    assert written(b) < frozen_bytes / 4  # the adapter's bytes, not the frozen ones
    shutil.rmtree(a)
    assert_loads(b, state)


def test_a_base_named_by_another_spelling_is_the_same_checkpoint(tmp_path, state):
    # The core's Location gives every spelling of a local folder one key:
    # the arrays saved to a plain path are found through a file:// URL.
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sk.save(a, state)
    sk.save(b, state, base=f"file://{tmp_path}/elsewhere/../a/")
    assert shared_with(b, a) >= state["frozen"].nbytes + state["adapter"].nbytes


def test_a_new_array_with_the_same_values_is_written(tmp_path, state):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sk.save(a, state)
    copied = {**state, "frozen": state["frozen"] + 0}  # equal values, another array
    sk.save(b, copied, base=a)
    assert shared_with(b, a) == 0
    shutil.rmtree(a)
    assert_loads(b, copied)


COMPARE = sk.Options(compare_with_base=True)


def test_equal_arrays_are_linked_where_the_save_compares_them(tmp_path, state):
    a, b, c = (str(tmp_path / n) for n in "abc")
    sk.save(a, state)
    rebuilt = {"frozen": state["frozen"] + 0, "adapter": state["adapter"] + 1}
    sk.save(b, rebuilt, base=a, options=COMPARE)
    as_numpy = {"frozen": np.asarray(state["frozen"]), "adapter": np.asarray(rebuilt["adapter"])}
    sk.save(c, as_numpy, base=a, options=COMPARE)  # one box, a's eight shards' chunks inside

    frozen_bytes = state["frozen"].nbytes
    for later in (b, c):
        assert shared_with(later, a) >= frozen_bytes
        assert written(later) < frozen_bytes / 4
    shutil.rmtree(a)
    assert_loads(b, rebuilt)
    assert_loads(c, as_numpy)


def test_compared_arrays_that_differ_are_written(tmp_path, state):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sk.save(a, state)
    # One element of one shard differs: that shard's chunks are written,
    # the seven others still linked.
    changed = {**state, "frozen": state["frozen"].at[ROWS - 1, COLS - 1].add(1.0)}
    sk.save(b, changed, base=a, options=COMPARE)
    frozen_bytes = state["frozen"].nbytes
    assert frozen_bytes / 8 <= written(b) < frozen_bytes / 4
    shutil.rmtree(a)
    assert_loads(b, changed)


def test_a_partly_frozen_linen_fine_tune_links_its_frozen_layer_when_comparing(tmp_path):
    """A Linen MLP whose first layer optax freezes (multi_transform with
    set_to_zero): the jitted step returns every parameter, the frozen ones
    as new arrays with equal values. Comparing finds them; without, every
    save writes them again."""
    import flax.linen as nn
    import flax.traverse_util

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x):
            hidden = nn.relu(nn.Dense(COLS, name="hidden")(x))
            return nn.Dense(4, name="out")(hidden)

    model = Mlp()
    params = model.init(jax.random.key(0), jnp.ones((2, COLS)))["params"]
    labels = flax.traverse_util.path_aware_map(
        lambda path, _: "frozen" if path[0] == "hidden" else "train", params)
    optimizer = optax.multi_transform({"train": optax.adam(1e-2), "frozen": optax.set_to_zero()},
                                      labels)

    @jax.jit
    def train_step(params, opt_state, x):
        grads = jax.grad(lambda p: jnp.mean(model.apply({"params": p}, x) ** 2))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    frozen_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params["hidden"]))
    for compare, most_written in ((True, frozen_bytes / 10), (False, None)):
        root = str(tmp_path / f"compare_{compare}")
        p, opt_state = params, optimizer.init(params)
        options = sk.Options(compare_with_base=compare)
        with sk.CheckpointManager(root, keep_last=2, options=options) as manager:
            for step in range(1, 4):
                p, opt_state = train_step(p, opt_state, jnp.full((2, COLS), step / 10.0))
                manager.save(step, {"params": p, "opt": opt_state})
                manager.wait()
            new_bytes = written(os.path.join(root, f"{3:09d}"))
            if most_written is not None:
                assert new_bytes < most_written
            else:
                assert new_bytes >= frozen_bytes
            state = {"params": p, "opt": opt_state}
            loaded = manager.load(3, state)
            for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(state), strict=True):
                assert_same_bits(got, want)


def test_loaded_arrays_are_taken_from_where_they_were_loaded(tmp_path, state):
    a, b, c = (str(tmp_path / n) for n in "abc")
    sk.save(a, state)
    restored = sk.load(a, state)  # as a resumed run gets its state
    sk.save(b, restored, base=a)
    assert shared_with(b, a) >= state["frozen"].nbytes

    # Loaded with a cast, the values differ from what is stored: written.
    cast = sk.load(a, {"frozen": jax.ShapeDtypeStruct(state["frozen"].shape, jnp.bfloat16,
                                                      sharding=state["frozen"].sharding),
                       "adapter": state["adapter"]},
                   options=sk.Options(allow_lossy_cast=True))
    sk.save(c, cast, base=a)
    assert shared_with(c, a) == 0
    shutil.rmtree(a)
    assert_loads(b, state)
    assert_loads(c, cast)


def test_async_saves_reuse_once_their_base_has_committed(tmp_path, state):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sk.save_async(a, state).result()
    sk.save_async(b, state, base=a).result()
    assert shared_with(b, a) >= state["frozen"].nbytes
    shutil.rmtree(a)
    assert_loads(b, state)


def test_a_replaced_base_is_not_taken_from(tmp_path, state, mesh):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    sk.save(a, state)
    other = {"frozen": sharded(np.ones((ROWS, COLS), np.float32), mesh),
             "adapter": state["adapter"]}
    sk.save(a, other, force=True)  # a no longer holds state["frozen"]
    sk.save(b, state, base=a)
    assert shared_with(b, a) == 0
    shutil.rmtree(a)
    assert_loads(b, state)


def test_a_missing_base_is_named(tmp_path, state):
    with pytest.raises(sk.NotFoundError, match="nowhere"):
        sk.save(str(tmp_path / "b"), state, base=str(tmp_path / "nowhere"))


def test_the_base_of_a_force_save_may_be_its_own_path(tmp_path, state):
    latest = str(tmp_path / "latest")
    sk.save(latest, state)
    state = {**state, "adapter": state["adapter"] * 2}
    sk.save(latest, state, base=latest, force=True)
    # The old checkpoint's folder is gone; its frozen bytes live on in the new one.
    assert_loads(latest, state)
    assert sum(os.stat(f).st_size for f in data_files(latest)) >= state["frozen"].nbytes


class LoraModel(nnx.Module):
    """Two 1024-wide layers with rank-8 LoRA adapters."""

    def __init__(self, rngs):
        self.l1 = nnx.LoRALinear(COLS, COLS, lora_rank=8, rngs=rngs)
        self.l2 = nnx.LoRALinear(COLS, 4, lora_rank=8, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def test_a_lora_fine_tune_under_a_manager_writes_only_what_trains(tmp_path):
    """Flax NNX LoRA with optax, frozen base split off as a jit argument:
    after the first step, each save writes the adapters and their Adam
    moments; retention deletes steps whose data later steps link, and
    every kept step still loads bit for bit, as does a resumed run's."""
    model = LoraModel(nnx.Rngs(0))
    graphdef, lora, frozen = nnx.split(model, nnx.LoRAParam, ...)
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(lora)

    @jax.jit
    def train_step(lora, opt_state, frozen, x, y):
        def loss(lora):
            out = nnx.merge(graphdef, lora, frozen)(x)
            return jnp.mean((out - y) ** 2)
        grads = jax.grad(loss)(lora)
        updates, opt_state = optimizer.update(grads, opt_state, lora)
        return optax.apply_updates(lora, updates), opt_state

    root = str(tmp_path / "run")
    frozen_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(frozen))
    trained_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves((lora, opt_state)))
    kept = {}
    with sk.CheckpointManager(root, keep_last=2) as manager:
        for step in range(1, 6):
            x = jnp.full((2, COLS), step / 10.0)
            lora, opt_state = train_step(lora, opt_state, frozen, x, jnp.ones((2, 4)))
            items = sk.Checkpointables(frozen=nnx.to_pure_dict(frozen),
                                       lora=nnx.to_pure_dict(lora), opt=opt_state)
            manager.save(step, items)
            manager.wait()
            kept[step] = jax.tree.map(np.asarray, dict(items))
            step_dir = os.path.join(root, f"{step:09d}")
            new_bytes = sum(os.stat(os.path.join(folder, f)).st_size
                            for part in ("frozen", "lora", "opt")
                            for folder in [os.path.join(step_dir, part, "data")]
                            for f in os.listdir(folder)
                            if os.stat(os.path.join(folder, f)).st_nlink == 1)
            if step > 1:
                assert new_bytes < trained_bytes + frozen_bytes / 10, (step, new_bytes)
        assert manager.all_steps() == [4, 5]
        for step in (4, 5):
            loaded = manager.load(step, sk.Checkpointables())
            for name in ("frozen", "lora", "opt"):
                got, want = jax.tree.leaves(loaded[name]), jax.tree.leaves(kept[step][name])
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert_same_bits(g, w)

    # A resumed run: the loaded frozen params are known to be in step 5.
    with sk.CheckpointManager(root, keep_last=2) as manager:
        target = sk.Checkpointables(frozen=nnx.to_pure_dict(frozen),
                                    lora=nnx.to_pure_dict(lora), opt=opt_state)
        step, restored = manager.restore(target)
        assert step == 5
        manager.save(6, restored)
        manager.wait()
        step6 = os.path.join(root, f"{6:09d}", "frozen")
        step5 = os.path.join(root, f"{5:09d}", "frozen")
        inodes5 = {os.stat(os.path.join(step5, "data", f)).st_ino
                   for f in os.listdir(os.path.join(step5, "data"))}
        assert any(os.stat(os.path.join(step6, "data", f)).st_ino in inodes5
                   for f in os.listdir(os.path.join(step6, "data")))


def test_on_an_object_store_unchanged_arrays_are_copied_on_the_server(s3, state):
    """No links there: the base's data files are copied by the server
    (CopyObject), no byte of them through this host; the new checkpoint
    holds its own copy, whole without the base."""
    a, b = s3.url("ft/a"), s3.url("ft/b")
    sk.save(a, state)
    state = {**state, "adapter": state["adapter"] - 1}
    read_before = _core.storage_bytes_read()
    sk.save(b, state, base=a)
    assert _core.storage_bytes_read() - read_before < 64 << 10  # metadata only
    _core.delete_checkpoint(a, sk.Options().to_core())
    assert_loads(b, state)


def test_a_manager_on_an_object_store_copies_unchanged_arrays_on_the_server(s3, state):
    root = s3.url("ft/run")
    with sk.CheckpointManager(root, keep_last=1) as manager:
        manager.save(1, state)
        manager.wait()
        state = {**state, "adapter": state["adapter"] + 1}
        read_before = _core.storage_bytes_read()
        manager.save(2, state)
        manager.wait()
        assert _core.storage_bytes_read() - read_before < 64 << 10  # metadata only
        assert manager.all_steps() == [2]  # step 1, the base, deleted
        loaded = manager.load(2, jax.tree.map(lambda a: a, state))
    for name in state:
        assert_same_bits(loaded[name], state[name])


def test_a_base_in_another_storage_is_refused(tmp_path, s3, state):
    local = str(tmp_path / "a")
    sk.save(local, state)
    with pytest.raises(sk.InvalidArgumentError, match="another storage"):
        sk.save(s3.url("b"), state, base=local)


def test_a_base_still_being_written_is_no_base_yet(tmp_path, state):
    """A loop of async saves, each naming the one before while it may still
    be writing: nothing fails; what cannot be known is written."""
    paths = [str(tmp_path / f"s{i}") for i in range(4)]
    futures = [sk.save_async(paths[0], state)]
    for earlier, path in zip(paths, paths[1:]):
        futures.append(sk.save_async(path, state, base=earlier))
    for future in futures:
        future.result()
    for path in paths:
        assert_loads(path, state)
