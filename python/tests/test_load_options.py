"""Partial loads, checkpointables loaded alone, dtype casts, tree mismatches."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices()[0]))


def test_partial_load(ckpt):
    sk.save(ckpt, {"a": np.ones(3), "b": {"c": np.zeros(2), "d": 4}})
    out = sk.load(ckpt, {"b": {"c": None}}, partial=True)
    assert list(out) == ["b"] and list(out["b"]) == ["c"]
    np.testing.assert_array_equal(out["b"]["c"], np.zeros(2))
    with pytest.raises(sk.IncompatibleError, match=r"'a'.*'b/d'.*partial=True"):
        sk.load(ckpt, {"b": {"c": None}})
    with pytest.raises(sk.IncompatibleError, match="'nope'"):
        sk.load(ckpt, {"nope": None}, partial=True)


def test_shape_mismatch_names_leaf_and_shapes(ckpt):
    sk.save(ckpt, {"w": np.ones((2, 3), np.float32)})
    with pytest.raises(sk.IncompatibleError, match=r"'w'.*\(2, 3\).*\(3, 2\)"):
        sk.load(ckpt, {"w": _sds((3, 2), jnp.float32)})


def test_checkpointable_loaded_alone(ckpt):
    params = {"w": jnp.arange(6.0), "b": np.int8(3)}
    sk.save_checkpointables(ckpt, {"params": params, "opt_state": {"m": jnp.zeros(6)},
                                   "dataset": b"\x00cursor\xff",
                                   "config": sk.JsonValue({"lr": 0.5, "name": "run"})})
    shutil.rmtree(os.path.join(ckpt, "opt_state"))
    shutil.rmtree(os.path.join(ckpt, "dataset"))
    out = sk.load_checkpointables(ckpt, {"params": None, "config": None})
    np.testing.assert_array_equal(out["params"]["w"], np.arange(6.0))
    assert out["params"]["b"] == 3 and out["config"] == {"lr": 0.5, "name": "run"}
    with pytest.raises(sk.NotFoundError, match="'state'"):
        sk.load(ckpt)


def test_bytes_checkpointable(ckpt):
    sk.save_checkpointables(ckpt, {"blob": bytearray(b"abc"), "empty": b""})
    assert sk.load_checkpointables(ckpt) == {"blob": b"abc", "empty": b""}


def test_lossy_cast_needs_permission(ckpt):
    sk.save(ckpt, {"x": jnp.linspace(0, 1, 7, dtype=jnp.float32)})
    target = {"x": _sds((7,), jnp.bfloat16)}
    with pytest.raises(sk.ShardkeepError, match="x"):
        sk.load(ckpt, target)
    out = sk.load(ckpt, target, options=sk.Options(allow_lossy_cast=True))["x"]
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(out, jnp.linspace(0, 1, 7, dtype=jnp.float32).astype(
        jnp.bfloat16))


def test_scalar_leaves_are_cast_by_the_rule_arrays_are(ckpt):
    # Python scalars are stored as bool, int64 or float64: into any other
    # dtype of their family only with allow_lossy_cast, as arrays.
    sk.save(ckpt, {"f": 0.1, "i": 7, "b": True, "a": np.full(2, 0.1)})
    same = sk.load(ckpt, {"f": np.array(0.0), "i": np.int64(0), "b": np.bool_(False),
                          "a": np.zeros(2)})
    assert (same["f"], same["i"], same["b"]) == (0.1, 7, True)
    assert np.asarray(same["f"]).dtype == np.float64 and same["i"].dtype == np.int64
    narrower = {"f": _sds((), jnp.float32), "i": np.int32(0), "b": np.bool_(False),
                "a": np.zeros(2, np.float32)}
    with pytest.raises(sk.IncompatibleError) as scalar:
        sk.load(ckpt, {**narrower, "a": np.zeros(2)})
    with pytest.raises(sk.IncompatibleError) as array:
        sk.load(ckpt, {**narrower, "f": np.array(0.0), "i": np.int64(0)})
    # The scalar's error names its leaf and says what the array's does.
    reason = "cannot cast float64 to float32 without allow_lossy_cast (it may lose precision)"
    assert "'f'" in str(scalar.value) and str(scalar.value).endswith(reason)
    assert "'a'" in str(array.value) and str(array.value).endswith(reason)
    with pytest.raises(sk.IncompatibleError, match=r"'i'.*cannot cast int64 to int32 without"):
        sk.load(ckpt, {**narrower, "f": np.array(0.0), "a": np.zeros(2)})
    cast = sk.load(ckpt, narrower, options=sk.Options(allow_lossy_cast=True))
    assert cast["f"].dtype == jnp.float32 and cast["f"] == np.float32(0.1)
    assert cast["i"].dtype == np.int32 and cast["i"] == 7
    # Across families is refused whatever the option, for scalars as for arrays.
    with pytest.raises(sk.IncompatibleError, match=r"'b'.*cannot cast bool to int32: unsupported"):
        sk.load(ckpt, {**narrower, "b": np.int32(0)}, options=sk.Options(allow_lossy_cast=True))


def test_weakly_typed_scalar_targets_take_python_numbers_as_jax_does(ckpt):
    # jax.eval_shape makes weakly typed int32/float32 targets of a state's
    # Python numbers (a train state's step): those take the stored int64 and
    # float64 as JAX takes Python numbers, a float rounded, an int if it fits.
    sk.save(ckpt, {"step": 7, "lr": 0.1, "big": 2**40, "huge": 1e300})
    target = jax.eval_shape(lambda: {"step": 0, "lr": 0.0, "big": 0, "huge": 0.0})
    assert target["step"].weak_type and target["step"].dtype == jnp.int32
    out = sk.load(ckpt, {**target, "big": np.int64(0), "huge": np.float64(0)})
    assert out["step"].dtype == jnp.int32 and out["step"] == 7
    assert out["lr"].dtype == jnp.float32 and out["lr"] == np.float32(0.1)
    # What JAX itself refuses of a Python number (an int that does not fit, a
    # float that overflows) falls back to the rule arrays follow.
    with pytest.raises(sk.IncompatibleError, match=r"'big'.*cannot cast int64 to int32"):
        sk.load(ckpt, {**target, "huge": np.float64(0)})
    with pytest.raises(sk.IncompatibleError, match=r"'huge'.*cannot cast float64 to float32"):
        sk.load(ckpt, {**target, "big": np.int64(0)})


def test_lossless_casts(ckpt):
    bf = jnp.asarray([1.5, -2.25, 3e38], jnp.bfloat16)
    ints = np.asarray([-32768, 0, 32767], np.int16)
    sk.save(ckpt, {"bf": bf, "ints": ints})
    out = sk.load(ckpt, {"bf": _sds((3,), jnp.float32), "ints": np.zeros(3, np.int32)})
    np.testing.assert_array_equal(out["bf"], np.asarray(bf).astype(np.float32))
    assert out["ints"].dtype == np.int32
    np.testing.assert_array_equal(out["ints"], ints.astype(np.int32))


def test_non_pytree_refuses_target(ckpt):
    sk.save_checkpointables(ckpt, {"blob": b"x"})
    with pytest.raises(sk.InvalidArgumentError):
        sk.load_checkpointables(ckpt, {"blob": np.zeros(1)})


def test_compression_level_reaches_the_core_and_is_checked(ckpt):
    assert sk.Options(compression="zstd", compression_level=3).to_core().zstd_level == 3
    assert sk.Options(compression="zstd").to_core().zstd_level == -30  # the measured default
    for bad in ("3", 1.5, True):
        with pytest.raises(sk.InvalidArgumentError, match="compression_level must be an int"):
            sk.Options(compression="zstd", compression_level=bad)
    values = {"w": np.linspace(0, 1, 4096, dtype=np.float32)}
    with pytest.raises(sk.InvalidArgumentError, match="zstd level 99 is outside"):
        sk.save(ckpt, values, options=sk.Options(compression="zstd", compression_level=99))
    sk.save(ckpt, values, options=sk.Options(compression="zstd", compression_level=5), force=True)
    assert_same_bits(sk.load(ckpt)["w"], values["w"])


def test_bad_arguments():
    with pytest.raises(sk.InvalidArgumentError):
        sk.Options(compression="gzip")
    with pytest.raises(sk.InvalidArgumentError):
        sk.save_checkpointables("memory://bad/a", {"../x": 1})
    with pytest.raises(sk.InvalidArgumentError):
        sk.save_checkpointables("memory://bad/b", {"c": sk.JsonValue({"n": float("nan")})})
