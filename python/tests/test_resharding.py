"""Save under one sharding, load under another: bit-exact, every shard checked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

import shardkeep as sk
from conftest import assert_same_bits, make_mesh

# Small chunks so that stored chunks and target boxes rarely line up.
_OPTIONS = sk.Options(chunk_bytes=96)


def _named(mesh_shape, names, *spec, devices=None):
    return NamedSharding(make_mesh(mesh_shape, names, devices), P(*spec))


def _single(i):
    return SingleDeviceSharding(jax.devices()[i])


_CASES = {
    "x8_to_y_on_2x4": ((16, 8), lambda: _named((8,), ("x",), "x"),
                       lambda: _named((2, 4), ("x", "y"), None, "y")),
    "x8_to_replicated": ((16, 8), lambda: _named((8,), ("x",), "x"),
                         lambda: _named((2, 4), ("x", "y"))),
    "x8_to_single_device": ((16, 8), lambda: _named((8,), ("x",), "x"), lambda: _single(5)),
    "2d_transposed": ((8, 8), lambda: _named((2, 4), ("x", "y"), "x", "y"),
                      lambda: _named((4, 2), ("x", "y"), "y", "x")),
    "partially_replicated": ((8, 12), lambda: _named((4, 2), ("x", "y"), "x", None),
                             lambda: _named((2, 4), ("x", "y"), None, "y")),
    "single_to_two_axes": ((16, 3), lambda: _single(2),
                           lambda: _named((2, 4), ("x", "y"), ("x", "y"), None)),
    "uneven_10x6": ((10, 6), lambda: _named((2, 4), ("x", "y"), "x", None),
                    lambda: _named((4, 2), ("y", "x"), None, "x")),
    "permuted_devices": ((8, 4, 2), lambda: _named((8,), ("x",), "x", None, None),
                         lambda: _named((4, 2), ("a", "b"), "a", "b", None,
                                        devices=jax.devices()[::-1])),
}


@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_reshard(ckpt, case, dtype):
    shape, source, target = _CASES[case]
    expected = np.arange(np.prod(shape), dtype=np.float32).reshape(shape).astype(dtype)
    saved = jax.device_put(expected, source())
    sk.save(ckpt, {"a": saved}, options=_OPTIONS)
    want = target()
    out = sk.load(ckpt, {"a": jax.ShapeDtypeStruct(shape, dtype, sharding=want)},
                  options=_OPTIONS)["a"]
    assert out.sharding == want
    assert_same_bits(np.asarray(out), expected)
    for shard in out.addressable_shards:
        assert_same_bits(np.asarray(shard.data), expected[shard.index])


def test_concrete_array_target_and_jit_output(ckpt):
    sharding = _named((2, 4), ("x", "y"), "y", "x")
    make = jax.jit(lambda: jnp.arange(64.0).reshape(8, 8), out_shardings=sharding)
    sk.save(ckpt, {"a": make()})
    target = jax.device_put(jnp.zeros((8, 8)), _named((8,), ("x",), None, "x"))
    out = sk.load(ckpt, {"a": target})["a"]
    assert out.sharding == target.sharding
    np.testing.assert_array_equal(out, np.arange(64.0).reshape(8, 8))


def test_replicated_box_is_not_shared_between_devices(ckpt):
    sk.save(ckpt, {"a": np.arange(8, dtype=np.float32)})
    replicated = _named((8,), ("x",))
    out = sk.load(ckpt, {"a": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=replicated)})["a"]
    pointers = {s.data.unsafe_buffer_pointer() for s in out.addressable_shards}
    assert len(pointers) == 8
