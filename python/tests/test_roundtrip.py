"""Save then load without surprises: dtypes, shapes, layouts, tree structure."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardkeep as sk
from shardkeep import _core
from conftest import assert_same_bits, sample_array

_DTYPES = [
    "bool", "int4", "uint4", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
]


@pytest.mark.parametrize("name", _DTYPES)
def test_every_dtype_numpy_and_jax(ckpt, name):
    host = sample_array(name)
    with jax.enable_x64(True):
        tree = {"np": host, "jax": jax.device_put(host), "zero_d": host[0, 0].copy()}
        sk.save(ckpt, tree)
        out = sk.load(ckpt)
    for key in tree:
        assert_same_bits(out[key], np.asarray(tree[key]))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,)])
def test_zero_d_and_zero_size(ckpt, shape):
    host = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    tree = {"np": host, "jax": jnp.asarray(host), "bf16": jnp.asarray(host, jnp.bfloat16)}
    sk.save(ckpt, tree)
    out = sk.load(ckpt)
    for key in tree:
        assert_same_bits(out[key], np.asarray(tree[key]))
    restored = sk.load(ckpt, jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[1])), tree))
    for key in tree:
        assert_same_bits(restored[key], np.asarray(tree[key]))


def test_non_contiguous_and_big_endian_numpy(ckpt):
    a = np.arange(48, dtype=np.int32).reshape(6, 8)
    tree = {"strided": a[:, ::2], "transposed": a.T, "reversed": a[::-1],
            "big_endian": a.astype(">i4")}
    sk.save(ckpt, tree)
    out = sk.load(ckpt)
    for key in ("strided", "transposed", "reversed"):
        assert_same_bits(out[key], np.ascontiguousarray(tree[key]))
    np.testing.assert_array_equal(out["big_endian"], a)


def test_key_paths_with_unicode_spaces_and_slashes(ckpt):
    tree = {"a/b": np.ones(2), "ü ñ 名前": {"x y": np.zeros(3)}, "~t": 1, 3: "three",
            "": np.arange(2)}
    sk.save(ckpt, tree)
    leaves = sk.metadata(ckpt).checkpointables["state"].leaves
    assert [leaf.path for leaf in leaves] == ["a~1b", "ü ñ 名前/x y", "~0t", "3", ""]
    out = sk.load(ckpt)
    assert list(out) == list(tree)  # Insertion order kept.
    np.testing.assert_array_equal(out["a/b"], tree["a/b"])
    np.testing.assert_array_equal(out["ü ñ 名前"]["x y"], tree["ü ñ 名前"]["x y"])
    assert out["~t"] == 1 and out[3] == "three"
    # With a target the leaves are matched by escaped path too (JAX cannot
    # flatten dicts mixing int and str keys, so the int key is left out).
    target = {k: v for k, v in tree.items() if k != 3}
    again = sk.load(ckpt, target, partial=True)
    np.testing.assert_array_equal(again["ü ñ 名前"]["x y"], tree["ü ñ 名前"]["x y"])


def test_colliding_key_paths_are_refused(ckpt):
    with pytest.raises(sk.InvalidArgumentError, match="'1'"):
        sk.save(ckpt, {1: np.ones(1), "1": np.ones(1)})


def test_scalars_strings_and_none(ckpt):
    tree = {"t": True, "i": -(2**62), "f": 0.1, "nan": float("nan"), "inf": float("-inf"),
            "s": "héllo", "none": None, "np_scalar": np.float32(1.5), "np_int": np.int16(-3)}
    sk.save(ckpt, tree)
    out = sk.load(ckpt)
    assert out["t"] is True and out["i"] == -(2**62) and out["f"] == 0.1
    assert np.isnan(out["nan"]) and out["inf"] == float("-inf")
    assert out["s"] == "héllo" and out["none"] is None
    assert_same_bits(out["np_scalar"], np.float32(1.5))
    assert_same_bits(out["np_int"], np.int16(-3))
    # Typed targets: numpy scalars come back as numpy scalars, 0-d jax arrays
    # as arrays (0.1 into float32 would be a lossy cast: test_load_options).
    typed = sk.load(ckpt, {**tree, "np_scalar": np.float32(0), "i": np.int64(0),
                           "t": jax.ShapeDtypeStruct((), jnp.bool_)})
    assert isinstance(typed["np_scalar"], np.float32) and typed["np_scalar"] == 1.5
    assert typed["i"] == -(2**62) and isinstance(typed["t"], jax.Array) and typed["t"]


def test_unsupported_leaf_is_refused(ckpt):
    with pytest.raises(sk.InvalidArgumentError, match="'a/0'.*object"):
        sk.save(ckpt, {"a": [object()]})


Point = collections.namedtuple("Point", ["x", "y"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
    first: jax.Array
    second: jax.Array


def test_containers_rebuilt_without_target(ckpt):
    tree = {"p": Point(np.int32(1), [np.ones(2), (np.zeros(1),)]), "t": (), "l": [],
            "d": {}, "pair": Pair(jnp.ones(2), jnp.zeros(3))}
    sk.save(ckpt, tree)
    out = sk.load(ckpt)
    assert type(out["p"]).__name__ == "Point" and out["p"]._fields == ("x", "y")
    assert isinstance(out["p"].y, list) and isinstance(out["p"].y[1], tuple)
    assert out["t"] == () and out["l"] == [] and out["d"] == {}
    assert set(out["pair"]) == {"first", "second"}  # Custom nodes come back as dicts.
    # With a target, registered classes come back as themselves.
    again = sk.load(ckpt, tree)
    assert isinstance(again["pair"], Pair) and isinstance(again["p"], Point)
    np.testing.assert_array_equal(again["pair"].second, np.zeros(3))


def test_memory_url_round_trip():
    tree = {"w": jnp.arange(12.0).reshape(3, 4), "step": 7}
    sk.save("memory://roundtrip/a", tree, step=7, custom_metadata={"run": "x"})
    out = sk.load("memory://roundtrip/a")
    np.testing.assert_array_equal(out["w"], np.asarray(tree["w"]))
    info = sk.metadata("memory://roundtrip/a")
    assert info.step == 7 and info.custom_metadata == {"run": "x"}


def test_metadata(ckpt):
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    w = jax.device_put(jnp.ones((8, 4), jnp.bfloat16),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    sk.save_checkpointables(ckpt, {"params": {"w": w, "n": 3}, "blob": b"abc",
                                   "cfg": sk.JsonValue({"lr": 0.1})}, step=12)
    info = sk.metadata(ckpt)
    assert info.step == 12
    assert {n: c.kind for n, c in info.checkpointables.items()} == {
        "params": "pytree", "blob": "bytes", "cfg": "json"}
    w_info, n_info = info.checkpointables["params"].leaves
    assert (w_info.path, w_info.shape, w_info.dtype, w_info.bytes) == ("w", (8, 4), "bfloat16", 64)
    assert w_info.sharding["type"] == "named" and w_info.sharding["spec"] == ["x"]
    assert (n_info.kind, n_info.value) == ("scalar", 3)
    # The saved shardings rebuild when the devices exist.
    restored = sk.load_checkpointables(
        ckpt, {"params": info.checkpointables["params"].abstract_tree()})["params"]
    assert restored["w"].sharding == w.sharding and restored["n"] == 3


def test_save_async_future(ckpt):
    fut = sk.save_async(ckpt, {"a": jnp.ones(4)})
    assert isinstance(fut, sk.SaveFuture)
    fut.result(timeout=60)
    assert fut.done()
    np.testing.assert_array_equal(sk.load(ckpt)["a"], np.ones(4))


def test_zstd_compression(ckpt):
    tree = {"zeros": jnp.zeros((64, 64)), "noise": np.random.default_rng(1).normal(size=999)}
    options = sk.Options(compression="zstd", chunk_bytes=4096)
    sk.save(ckpt, tree, options=options)
    out = sk.load(ckpt, options=options)
    assert_same_bits(out["zeros"], np.asarray(tree["zeros"]))
    assert_same_bits(out["noise"], tree["noise"])


def test_save_error_surfaces(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    with pytest.raises(sk.ShardkeepError):
        sk.save_async(str(blocker / "ckpt"), {"a": np.ones(2)}).result(timeout=60)


def test_registered_kind(ckpt):
    class Cursor:
        def __init__(self, pos):
            self.pos = pos

    sk.register_kind("cursor", base="json", type=Cursor, save=lambda c: {"pos": c.pos},
                     load=lambda d: Cursor(d["pos"]))
    sk.save_checkpointables(ckpt, {"cursor": Cursor(41)})
    assert sk.load_checkpointables(ckpt, {"cursor": None})["cursor"].pos == 41


def test_unsupported_dtype_is_refused_clearly(ckpt):
    with pytest.raises(sk.InvalidArgumentError, match="'g'.*unsupported dtype.*PRNG keys"):
        sk.save(ckpt, {"g": np.zeros(3, jax.dtypes.float0)})


def test_root_leaf(ckpt):
    sk.save(ckpt, jnp.arange(3))
    assert_same_bits(sk.load(ckpt), np.arange(3, dtype=np.int32))
    out = sk.load(ckpt, jax.ShapeDtypeStruct((3,), jnp.int32))
    assert isinstance(out, jax.Array)


def test_loaded_shards_own_distinct_memory(ckpt):
    # The reader fills 64-byte aligned buffers, which device_put on the CPU
    # backend adopts without a copy; no two shards may share memory.
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    sk.save(ckpt, {"w": jax.device_put(jnp.arange(64 * 1024, dtype=jnp.float32), sharding)})
    target = {"w": jax.ShapeDtypeStruct((64 * 1024,), jnp.float32, sharding=sharding)}
    loaded = sk.load(ckpt, target)["w"]
    pointers = {s.data.unsafe_buffer_pointer() for s in loaded.addressable_shards}
    assert len(pointers) == 8 and all(p % 64 == 0 for p in pointers)
    np.testing.assert_array_equal(np.asarray(loaded), np.arange(64 * 1024, dtype=np.float32))


# -- checkpointable names: the core's one rule ---------------------------------

_BAD_NAMES = ["", ".hidden", "a/b", "a b", "..", "_SHARDKEEP", "\u00e9", "x" * 256]


@pytest.mark.parametrize("name", _BAD_NAMES)
def test_a_bad_checkpointable_name_is_refused_as_the_core_refuses_it(tmp_path, name):
    # The same names as CheckpointWriterTest.WriterAndSaveRefuseTheSameNames.
    with pytest.raises(sk.InvalidArgumentError) as by_core:
        _core.check_checkpointable_name(name)
    with pytest.raises(sk.InvalidArgumentError) as by_save:
        sk.save_checkpointables(str(tmp_path / "c"), {name: {"w": np.ones(2)}})
    assert str(by_save.value) == str(by_core.value)
    assert "[A-Za-z0-9_.-]" in str(by_core.value)
    assert not (tmp_path / "c").exists()


def test_every_name_the_core_accepts_saves_and_loads(tmp_path):
    names = ["_opt", "-x", "a.b", "y" * 255]
    sk.save_checkpointables(str(tmp_path / "c"), {n: {"w": np.full(2, i)} for i, n in
                                                  enumerate(names)})
    loaded = sk.load_checkpointables(str(tmp_path / "c"))
    assert sorted(loaded) == sorted(names)
    np.testing.assert_array_equal(loaded["_opt"]["w"], np.full(2, 0))


def test_a_saved_none_needs_no_target_leaf(tmp_path):
    """Pytree libraries flatten empty nodes (optax's EmptyState) to no leaf,
    and a None holds nothing: a target may leave it out."""
    ckpt = str(tmp_path / "ckpt")
    sk.save(ckpt, {"w": np.arange(3, dtype=np.int32), "empty": None})
    loaded = sk.load(ckpt, {"w": np.zeros(3, np.int32)})
    assert list(loaded) == ["w"]
    np.testing.assert_array_equal(loaded["w"], np.arange(3, dtype=np.int32))
