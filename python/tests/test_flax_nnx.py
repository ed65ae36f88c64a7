"""The Flax NNX workflow end to end: split, save, load onto another mesh, merge, resume.

The model holds every kind of NNX state a real one does: parameters
sharded by partition specs, BatchNorm statistics, and the typed PRNG keys
and counters of an ``nnx.Rngs`` that Dropout draws from.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding

import shardkeep as sk
from conftest import make_mesh
from index_reader import read_index

AXES = ("data", "model")


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        def sharded(*names):
            return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)

        self.hidden = nnx.Linear(16, 32, kernel_init=sharded(None, "model"), rngs=rngs)
        self.norm = nnx.BatchNorm(32, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(32, 4, kernel_init=sharded("model", None), rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x)))))


def build_model(seed=0):
    return Model(nnx.Rngs(params=seed, dropout=seed + 1))


def build_optimizer(model):
    return nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def new_model(mesh, seed=0):
    with jax.set_mesh(mesh):  # the partitioned initializers place the params on it
        return build_model(seed)


def batch(step):
    rng = np.random.default_rng(step)
    return (jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
            jnp.asarray(rng.normal(size=(8, 4)), jnp.float32))


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(m):
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def new_optimizer(model, mesh):
    with jax.set_mesh(mesh):
        return build_optimizer(model)


def trained_model(mesh, steps=2):
    model = new_model(mesh)
    optimizer = new_optimizer(model, mesh)
    for step in range(steps):
        train_step(model, optimizer, *batch(step))
    return model, optimizer


def abstract_state(mesh, of=lambda m: m):
    """What a user restores onto: nnx.eval_shape + nnx.state, with shardings
    from the model's partition specs on ``mesh``."""
    with jax.set_mesh(mesh):
        abstract = nnx.eval_shape(lambda: of(build_model(seed=9)))
    state = nnx.state(abstract)
    specs = nnx.get_partition_spec(state)
    return jax.tree.map(
        lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec)),
        state, specs)


def assert_states_equal(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape, jax.tree_util.keystr(path)
        if jax.dtypes.issubdtype(g.dtype, jax.dtypes.prng_key):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w),
                                      err_msg=jax.tree_util.keystr(path))


def placed_like(graphdef, state, loaded):
    """The original model with its state placed as ``loaded`` is: outputs
    are bit-identical only between computations on the same layout."""
    return nnx.merge(graphdef, jax.device_put(state, jax.tree.map(lambda a: a.sharding, loaded)))


def assert_same_outputs(a, b):
    """Same outputs in eval mode, and in train mode with dropout (same RNG
    streams, so the same masks), twice in a row."""
    x, _ = batch(100)
    a.eval(), b.eval()
    np.testing.assert_array_equal(np.asarray(a(x)), np.asarray(b(x)))
    a.train(), b.train()
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(a(x)), np.asarray(b(x)))


def test_state_holds_typed_keys_and_bn_statistics():
    model, _ = trained_model(make_mesh((2, 4), AXES))
    _, state = nnx.split(model)
    dtypes = {jax.tree_util.keystr(p): leaf.dtype
              for p, leaf in jax.tree_util.tree_leaves_with_path(state)}
    assert any(jax.dtypes.issubdtype(d, jax.dtypes.prng_key) for d in dtypes.values())
    assert any("mean" in p for p in dtypes)


def test_split_save_load_on_another_mesh_merge(ckpt):
    model, _ = trained_model(make_mesh((2, 4), AXES))
    graphdef, state = nnx.split(model)
    sk.save(ckpt, state)

    other = make_mesh((4, 2), AXES)
    loaded = sk.load(ckpt, abstract_state(other))
    assert isinstance(loaded, nnx.State)
    assert_states_equal(loaded, state)
    kernel = loaded["hidden"]["kernel"].get_value()
    assert kernel.sharding == NamedSharding(other, jax.sharding.PartitionSpec(None, "model"))
    assert_same_outputs(placed_like(graphdef, state, loaded), nnx.merge(graphdef, loaded))


def test_pure_dict_round_trip(ckpt):
    model, _ = trained_model(make_mesh((2, 4), AXES))
    graphdef, state = nnx.split(model)
    sk.save_async(ckpt, nnx.to_pure_dict(state)).result()

    target = abstract_state(make_mesh((8, 1), AXES))
    pure = sk.load(ckpt, nnx.to_pure_dict(target))
    nnx.replace_by_pure_dict(target, pure)
    assert_states_equal(target, state)
    assert_same_outputs(placed_like(graphdef, state, target), nnx.merge(graphdef, target))


def test_abstract_mesh_target_loads_inside_set_mesh(ckpt):
    model, _ = trained_model(make_mesh((2, 4), AXES))
    graphdef, state = nnx.split(model)
    sk.save(ckpt, state)
    other = make_mesh((1, 8), AXES)
    with jax.set_mesh(other):
        abstract = nnx.state(nnx.eval_shape(lambda: build_model(seed=3)))
        loaded = sk.load(ckpt, abstract)
    assert loaded["hidden"]["kernel"].get_value().sharding.mesh == other
    assert_states_equal(loaded, state)
    assert_same_outputs(placed_like(graphdef, state, loaded), nnx.merge(graphdef, loaded))
    with pytest.raises(sk.InvalidArgumentError, match="abstract mesh.*jax.set_mesh"):
        sk.load(ckpt, abstract)


def test_manager_resume_with_dropout_is_bit_exact(tmp_path):
    mesh = make_mesh((2, 4), AXES)
    steps, resume_at = 8, 4
    model = new_model(mesh)
    optimizer = new_optimizer(model, mesh)
    expected = []
    with sk.CheckpointManager(tmp_path / "run", save_interval_steps=2, keep_last=2) as mgr:
        for step in range(steps):
            expected.append(float(train_step(model, optimizer, *batch(step))))
            mgr.save(step + 1, sk.Checkpointables(model=nnx.state(model),
                                                  opt=nnx.state(optimizer)))
        mgr.wait()
        assert mgr.all_steps() == [6, 8]

    # A fresh process would build a differently seeded model, then restore.
    with sk.CheckpointManager(tmp_path / "run") as mgr:
        restored = new_model(mesh, seed=5)
        restored_opt = new_optimizer(restored, mesh)
        loaded = mgr.load(6, sk.Checkpointables(model=abstract_state(mesh),
                                                opt=abstract_state(mesh, build_optimizer)))
        nnx.update(restored, loaded["model"])
        nnx.update(restored_opt, loaded["opt"])
        resumed = [float(train_step(restored, restored_opt, *batch(step)))
                   for step in range(6, steps)]
    assert resumed == expected[6:]
    assert_states_equal(nnx.state(restored), nnx.state(model))


def test_manager_saves_an_nnx_state_as_one_checkpointable(tmp_path):
    mesh = make_mesh((2, 4), AXES)
    model, _ = trained_model(mesh)
    graphdef, state = nnx.split(model)
    with sk.CheckpointManager(tmp_path / "run") as mgr:
        mgr.save(1, state)
        mgr.wait()
        assert list(sk.metadata(mgr.step_path(1)).checkpointables) == ["state"]
        # A concrete state as the target: its shardings and key types are used.
        loaded = mgr.load(1, nnx.state(new_model(mesh, seed=7)))
    assert isinstance(loaded, nnx.State)
    assert_states_equal(loaded, state)
    assert_same_outputs(model, nnx.merge(graphdef, loaded))


def test_compressed_training_state_loads_onto_another_mesh(tmp_path):
    """compression="zstd" on a model and its Adam state: every leaf decodes
    bit-exactly onto another mesh, in place or resharded."""
    model, optimizer = trained_model(make_mesh((2, 4), AXES))
    state = {"model": nnx.state(model), "opt": nnx.state(optimizer)}
    path = str(tmp_path / "ckpt")
    sk.save_checkpointables(path, state, options=sk.Options(compression="zstd"))
    codecs = {r["codec"] for index in (tmp_path / "ckpt").glob("*/index/*.idx")
              for r in read_index(index.read_bytes())}
    assert 2 in codecs, "some leaves are stored as zstd of byte planes"

    other = make_mesh((4, 2), AXES)
    loaded = sk.load_checkpointables(path, {
        "model": abstract_state(other), "opt": abstract_state(other, build_optimizer)})
    assert_states_equal(loaded["model"], state["model"])
    assert_states_equal(loaded["opt"], state["opt"])
