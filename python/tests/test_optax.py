"""A real optimizer state (registered pytree classes) round-trips with a target."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import make_mesh

import optax


def test_adamw_state_with_target(ckpt):
    mesh = make_mesh((2, 4), ("x", "y"))
    params = {"dense": {"kernel": jax.device_put(jnp.arange(32.0).reshape(8, 4),
                                                 NamedSharding(mesh, P("x", "y"))),
                        "bias": jnp.ones(4)}}
    tx = optax.adamw(1e-3)
    opt_state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = tx.update(grads, opt_state, params)
    sk.save_checkpointables(ckpt, {"params": params, "opt_state": opt_state})

    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), opt_state)
    out = sk.load_checkpointables(ckpt, {"opt_state": abstract})["opt_state"]
    assert jax.tree.structure(out) == jax.tree.structure(opt_state)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(opt_state)):
        assert got.sharding == want.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Without a target the registered classes come back as plain containers.
    plain = sk.load_checkpointables(ckpt, {"opt_state": None})["opt_state"]
    assert len(jax.tree.leaves(plain)) == len(jax.tree.leaves(opt_state))
