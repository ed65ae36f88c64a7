"""Typed PRNG key arrays (jax.random.key) are saved as key data and come back typed."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import make_mesh

IMPLS = ["threefry2x32", "rbg", "unsafe_rbg"]


def keys_of(impl, shape, seed=0):
    count = int(np.prod(shape))
    return jax.random.split(jax.random.key(seed, impl=impl), count).reshape(shape)


def same_keys(got, want):
    """Same key dtype (so the same implementation), shape and key data."""
    assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key), got.dtype
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)),
                                  np.asarray(jax.random.key_data(want)))


def saved_tree(impl):
    mesh = make_mesh((2, 4), ("a", "b"))
    sharding = NamedSharding(mesh, P("a", "b"))
    return {"grid": jax.device_put(keys_of(impl, (8, 8)), sharding),
            "one": jax.random.key(7, impl=impl),
            "row": keys_of(impl, (3,), seed=1),
            "w": jnp.arange(6.0)}


@pytest.mark.parametrize("impl", IMPLS)
def test_without_target_keys_come_back_typed_with_the_saved_sharding(ckpt, impl):
    tree = saved_tree(impl)
    sk.save(ckpt, tree)
    out = sk.load(ckpt)
    for name in ("grid", "one", "row"):
        same_keys(out[name], tree[name])
        assert out[name].sharding == tree[name].sharding, name
    assert isinstance(out["w"], np.ndarray)  # plain arrays still come back as numpy
    # The stored form: uint32 key data plus the implementation's name.
    meta = json.loads(open(os.path.join(ckpt, "state", "meta.json")).read())
    grid = next(leaf for leaf in meta["leaves"] if leaf["path"] == "grid")
    key_shape = jax.random.key_data(tree["one"]).shape
    assert grid["dtype"] == "uint32" and grid["prng_impl"] == impl
    assert grid["shape"] == [8, 8, *key_shape]
    assert grid["sharding"]["spec"] == ["a", "b"]


@pytest.mark.parametrize("impl", IMPLS)
def test_resharded_onto_a_target(ckpt, impl):
    tree = saved_tree(impl)
    sk.save(ckpt, tree, options=sk.Options(chunk_bytes=64))  # several chunks per shard
    other = make_mesh((4, 2), ("x", "y"))
    dtype = tree["grid"].dtype
    target = {"grid": jax.ShapeDtypeStruct((8, 8), dtype, sharding=NamedSharding(other, P(None, "y"))),
              "one": jax.ShapeDtypeStruct((), dtype, sharding=NamedSharding(other, P())),
              "row": jax.ShapeDtypeStruct((3,), dtype),
              "w": None}
    out = sk.load(ckpt, target)
    for name in ("grid", "one", "row"):
        same_keys(out[name], tree[name])
    assert out["grid"].sharding == target["grid"].sharding
    assert out["one"].sharding == target["one"].sharding
    # Each device holds its own part of the keys.
    for shard in out["grid"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(shard.data)),
                                      np.asarray(jax.random.key_data(tree["grid"])[shard.index]))
    # The loaded keys work as keys.
    np.testing.assert_array_equal(np.asarray(jax.random.uniform(out["one"], (4,))),
                                  np.asarray(jax.random.uniform(tree["one"], (4,))))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_uint32_target_gets_the_raw_key_data(ckpt, impl):
    tree = saved_tree(impl)
    sk.save(ckpt, tree)
    data = jax.random.key_data(tree["grid"])
    out = sk.load(ckpt, {"grid": jax.ShapeDtypeStruct(data.shape, jnp.uint32),
                         "one": np.zeros(jax.random.key_data(tree["one"]).shape, np.uint32)},
                  partial=True)
    assert out["grid"].dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(out["grid"]), np.asarray(data))
    np.testing.assert_array_equal(out["one"], np.asarray(jax.random.key_data(tree["one"])))


def test_async_save_owns_the_keys_before_they_are_donated(ckpt):
    keys = jax.device_put(keys_of("threefry2x32", (8, 8)),
                          NamedSharding(make_mesh((2, 4), ("a", "b")), P("a", "b")))
    want = np.asarray(jax.random.key_data(keys)).copy()
    step = jax.jit(lambda k: jax.vmap(jax.vmap(lambda x: jax.random.split(x)[0]))(k),
                   donate_argnums=0)
    future = sk.save_async(ckpt, {"rng": keys})
    keys = step(keys)  # the saved buffers are donated and overwritten
    future.result()
    got = sk.load(ckpt)["rng"]
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)), want)


def test_key_data_saved_by_hand_loads_as_typed_keys(ckpt):
    # The workaround older shardkeep asked for: saving jax.random.key_data(key).
    keys = keys_of("rbg", (4,))
    sk.save(ckpt, {"rng": jax.random.key_data(keys)})
    out = sk.load(ckpt, {"rng": jax.ShapeDtypeStruct((4,), keys.dtype)})
    same_keys(out["rng"], keys)


def test_mismatched_implementation_or_shape_is_incompatible(ckpt):
    sk.save(ckpt, {"rng": keys_of("threefry2x32", (4,))})
    rbg = jax.random.key(0, impl="rbg").dtype
    with pytest.raises(sk.IncompatibleError, match="'rng'.*threefry2x32.*rbg"):
        sk.load(ckpt, {"rng": jax.ShapeDtypeStruct((4,), rbg)})
    fry = jax.random.key(0).dtype
    with pytest.raises(sk.IncompatibleError, match=r"'rng'.*uint32\[4, 2\].*shape \[5\]"):
        sk.load(ckpt, {"rng": jax.ShapeDtypeStruct((5,), fry)})
    sk.save(ckpt, {"rng": jnp.zeros((4, 2), jnp.float32)}, force=True)
    with pytest.raises(sk.IncompatibleError, match="'rng'.*float32"):
        sk.load(ckpt, {"rng": jax.ShapeDtypeStruct((4,), fry)})


def test_metadata_and_abstract_tree_describe_keys(ckpt):
    tree = saved_tree("unsafe_rbg")
    sk.save(ckpt, tree)
    state = sk.metadata(ckpt).checkpointables["state"]
    grid = next(leaf for leaf in state.leaves if leaf.path == "grid")
    assert grid.prng_impl == "unsafe_rbg" and grid.dtype == "uint32"
    assert grid.shape == (8, 8, 4) and grid.bytes == 8 * 8 * 4 * 4
    abstract = state.abstract_tree()
    assert abstract["grid"].dtype == tree["grid"].dtype and abstract["grid"].shape == (8, 8)
    assert abstract["grid"].sharding == tree["grid"].sharding
    out = sk.load(ckpt, abstract)
    same_keys(out["grid"], tree["grid"])
    assert out["grid"].sharding == tree["grid"].sharding
