"""shardkeep.orbax.v1 runs programs written against Orbax v1's training Checkpointer unchanged.

As in test_orbax_dropin.py, the same trainer runs with Orbax's own module
(``orbax.checkpoint.experimental.v1``) and with ``shardkeep.orbax.v1``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import shardkeep as sk
from conftest import make_mesh
from shardkeep.orbax import v1 as sk_v1
from test_flax_nnx import (AXES, abstract_state, assert_states_equal, batch, build_optimizer,
                           new_model, new_optimizer, train_step)

real_v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
BOTH = pytest.mark.parametrize("ocp", [real_v1, sk_v1], ids=["orbax", "shardkeep"])
TOTAL_STEPS = 8


def train(ocp, root, mesh, stop_after=None):
    """A trainer written against Orbax v1's Checkpointer: resumes from its
    latest step, saves every second step (two kept) as two checkpointables;
    ``stop_after`` stops it there without closing the Checkpointer."""
    model = new_model(mesh)
    optimizer = new_optimizer(model, mesh)
    key = jax.random.key(11)
    training = ocp.training
    ckptr = training.Checkpointer(
        root, save_decision_policy=training.save_decision_policies.FixedIntervalPolicy(2),
        preservation_policy=training.preservation_policies.LatestN(2))
    start = 0
    if ckptr.latest is not None:
        start = ckptr.latest.step
        replicated = NamedSharding(mesh, PartitionSpec())
        loaded = ckptr.load_checkpointables(ckptr.latest, {
            "model": abstract_state(mesh),
            "train": {"optimizer": abstract_state(mesh, build_optimizer),
                      "key": jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)}})
        nnx.update(model, loaded["model"])
        nnx.update(optimizer, loaded["train"]["optimizer"])
        key = loaded["train"]["key"]
    losses = {}
    for step in range(start, TOTAL_STEPS):
        key, noise = jax.random.split(key)
        x, y = batch(step)
        losses[step] = float(train_step(model, optimizer,
                                        x + 0.01 * jax.random.normal(noise, x.shape), y))
        state = {"model": nnx.state(model),
                 "train": {"optimizer": nnx.state(optimizer), "key": key}}
        # A copy: Orbax's own save adds its metrics to the dict it is given.
        ckptr.save_checkpointables(step + 1, dict(state), metrics={"loss": losses[step]})
        if step + 1 == stop_after:
            return losses, state  # killed: never closed
    ckptr.close()
    return losses, state


def test_a_v1_trainer_resumes_alike_under_orbax_and_shardkeep(tmp_path):
    mesh = make_mesh((2, 4), AXES)
    expected, expected_state = train(real_v1, tmp_path / "uninterrupted", mesh)
    results = {}
    for name, ocp in (("orbax", real_v1), ("shardkeep", sk_v1)):
        root = tmp_path / name
        first, _ = train(ocp, root, mesh, stop_after=5)
        resumed, state = train(ocp, root, mesh)
        with ocp.training.Checkpointer(root) as ckptr:
            listed = [(c.step, c.metrics) for c in ckptr.checkpoints]
        results[name] = (first, resumed, state, listed)
    for name, (first, resumed, state, listed) in results.items():
        assert first == {s: expected[s] for s in range(5)}, name
        assert resumed == {s: expected[s] for s in range(4, TOTAL_STEPS)}, name
        assert listed == [(6, {"loss": expected[5]}), (8, {"loss": expected[7]})], name
        assert_states_equal(state, expected_state)


@BOTH
def test_save_and_load_one_pytree(ocp, tmp_path):
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.int32(4)}
    with ocp.training.Checkpointer(tmp_path / "run") as ckptr:
        assert ckptr.save_pytree(0, tree)
        assert not ckptr.should_save(0)
        assert ckptr.latest.step == 0
        got = ckptr.load_pytree(None, jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree))
        as_saved = ckptr.load(0)
    for value in (got, as_saved):
        for name in tree:
            np.testing.assert_array_equal(np.asarray(value[name]), np.asarray(tree[name]))


@BOTH
def test_default_policy_saves_the_first_step_and_keeps_every_step(ocp, tmp_path):
    with ocp.training.Checkpointer(tmp_path / "run") as ckptr:
        for step in range(3):
            ckptr.save(step, {"a": jnp.full(2, step)})
            ckptr.wait()
        assert [c.step for c in ckptr.checkpoints] == [0, 1, 2]


@BOTH
def test_custom_metadata_is_kept_with_its_step(ocp, tmp_path):
    custom = {"scan_layers": False, "lora": {"rank": 4}}
    with ocp.training.Checkpointer(tmp_path / "run") as ckptr:
        ckptr.save(0, {"a": jnp.ones(2)}, custom_metadata=custom)
        ckptr.wait()
        ckptr.save_checkpointables(1, {"state": {"a": jnp.ones(2)}}, force=True)
        ckptr.wait()
        assert ckptr.metadata(0).custom_metadata == custom
        assert ckptr.metadata(ckptr.latest).step == 1
        assert not ckptr.metadata().custom_metadata


REFUSED = [
    ("context", lambda root: sk_v1.training.Checkpointer(root, context=object())),
    ("step_name_format", lambda root: sk_v1.training.Checkpointer(root,
                                                                  step_name_format=object())),
    ("custom_metadata", lambda root: sk_v1.training.Checkpointer(root, custom_metadata={"a": 1})),
    ("lightweight_initialize", lambda root: sk_v1.training.Checkpointer(
        root, lightweight_initialize=True)),
    ("logger", lambda root: sk_v1.training.Checkpointer(root, logger=object())),
    ("overwrite", lambda root: sk_v1.training.Checkpointer(root).save(0, {}, overwrite=True)),
    ("timeout", lambda root: sk_v1.training.Checkpointer(root).save_async(
        0, {"a": jnp.ones(1)}).result(timeout=5)),
]


@pytest.mark.parametrize("name,call", REFUSED, ids=[f"{i}-{n}" for i, (n, _) in enumerate(REFUSED)])
def test_an_unsupported_argument_is_refused_by_name(tmp_path, name, call):
    with pytest.raises(sk.InvalidArgumentError,
                       match=rf"\b{name}=.* is not supported by shardkeep\.orbax.*: \w"):
        call(tmp_path / "run")
