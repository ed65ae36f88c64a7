"""States of other model libraries: Flax Linen with a TrainState, optax, Equinox."""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import make_mesh


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(32)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.Dropout(0.5, deterministic=not train)(nn.relu(x))
        return nn.Dense(4)(x)


class TrainState(train_state.TrainState):
    batch_stats: dict


def linen_state():
    net = LinenNet()
    x = jnp.ones((8, 16))
    variables = net.init(jax.random.key(0), x, train=False)
    state = TrainState.create(apply_fn=net.apply, params=variables["params"],
                              batch_stats=variables["batch_stats"], tx=optax.adamw(1e-2))
    rng = jax.random.key(1)

    @jax.jit
    def step(state, rng):
        rng, dropout = jax.random.split(rng)

        def loss_fn(params):
            out, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, x, train=True,
                rngs={"dropout": dropout}, mutable=["batch_stats"])
            return jnp.mean(out ** 2), updates

        grads, updates = jax.grad(loss_fn, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"]), rng

    for _ in range(2):
        state, rng = step(state, rng)
    return net, state, rng


def assert_trees_equal(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_linen_train_state_with_batch_stats_and_rng(ckpt):
    net, state, rng = linen_state()
    sk.save_async(ckpt, {"train": state, "rng": rng}).result()

    mesh = make_mesh((2, 4), ("x", "y"))
    replicated = NamedSharding(mesh, P())
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                            {"train": state, "rng": rng})
    loaded = sk.load(ckpt, abstract)
    assert isinstance(loaded["train"], TrainState) and loaded["train"].apply_fn == net.apply
    assert_trees_equal(loaded, {"train": state, "rng": rng})
    x = jnp.ones((8, 16))
    variables = {"params": loaded["train"].params, "batch_stats": loaded["train"].batch_stats}
    want = net.apply({"params": state.params, "batch_stats": state.batch_stats}, x, train=False)
    np.testing.assert_allclose(np.asarray(net.apply(variables, x, train=False)),
                               np.asarray(want), rtol=1e-6)
    # Linen variables saved as they are (a plain dict of collections).
    sk.save(ckpt, {"params": state.params, "batch_stats": state.batch_stats}, force=True)
    assert_trees_equal(sk.load(ckpt, variables), variables)


def test_optax_chain_with_schedule_and_masked_states(ckpt):
    params = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4)}
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2),
                     optax.masked(optax.add_decayed_weights(1e-4), {"w": True, "b": False}))
    opt_state = tx.init(params)
    _, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), opt_state, params)
    sk.save(ckpt, opt_state)
    loaded = sk.load(ckpt, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                        opt_state))
    assert_trees_equal(loaded, opt_state)


class EqxNet(eqx.Module):
    mlp: eqx.nn.MLP
    key: jax.Array  # a typed key held by the module

    def __init__(self, key):
        init, self.key = jax.random.split(key)
        self.mlp = eqx.nn.MLP(16, 4, width_size=32, depth=2, key=init)


def test_equinox_function_leaf_is_named_and_partitioned_model_round_trips(ckpt):
    model = EqxNet(jax.random.key(0))
    with pytest.raises(sk.InvalidArgumentError, match="'mlp/activation'.*eqx.partition"):
        sk.save(ckpt, model)

    params, static = eqx.partition(model, eqx.is_array)
    sk.save(ckpt, params)
    abstract = eqx.filter_eval_shape(EqxNet, jax.random.key(5))
    abstract_params, _ = eqx.partition(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    restored = eqx.combine(sk.load(ckpt, abstract_params), static)
    assert_trees_equal(eqx.filter(restored, eqx.is_array), params)
    x = jnp.ones(16)
    np.testing.assert_array_equal(np.asarray(restored.mlp(x)), np.asarray(model.mlp(x)))
