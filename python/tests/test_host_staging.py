"""Native staging: the core carves each box a save writes out of the host
arrays that hold it (``_core.carve_shards``). A box carved wrong would
save wrong bytes, so every case compares them with numpy's slicing of the
same array, and saves of sharded trees are loaded back bit for bit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from shardkeep.errors import InvalidArgumentError
from conftest import assert_same_bits, make_mesh, sample_array

_DTYPES = ["float32", "bfloat16", "int4", "uint4", "bool", "complex128", "float8_e4m3fn",
           "int16", "float16"]


def _boxes_of(shape, rng, count=6):
    """Random boxes inside ``shape``, the whole array and an empty one among them."""
    boxes = [((0,) * len(shape), tuple(shape)), ((0,) * len(shape), (0,) * len(shape))]
    for _ in range(count):
        origin = tuple(int(rng.integers(0, n)) for n in shape)
        extent = tuple(int(rng.integers(1, n - o + 1)) for o, n in zip(origin, shape))
        boxes.append((origin, extent))
    return boxes


def _expected(view, origin, shape):
    return np.ascontiguousarray(
        view[tuple(slice(o, o + n) for o, n in zip(origin, shape))]).tobytes()


def _views_of(base):
    """A C-contiguous array and views of it that are not."""
    return {"contiguous": base, "transposed": base.T, "reversed": base[::-1],
            "strided": base[:, ::2], "both": base[::-2, 1::3].T}


@pytest.mark.parametrize("name", _DTYPES)
def test_boxes_carved_from_any_view_hold_numpys_bytes(name):
    rng = np.random.default_rng(7)
    for kind, view in _views_of(sample_array(name, shape=(7, 11), seed=3)).items():
        boxes = _boxes_of(view.shape, rng)
        layout = _core.LeafLayout(5, name, [((0, 0), view.shape)],
                                  [(0, origin, shape) for origin, shape in boxes])
        shards = _core.carve_shards([layout], [[view]])
        assert len(shards) == len(boxes) == layout.box_count
        for shard, (origin, shape) in zip(shards, boxes):
            assert (shard.leaf, shard.dtype) == (5, name)
            assert (tuple(shard.origin), tuple(shard.shape)) == (origin, shape)
            assert shard.data.dtype == np.uint8 and shard.data.ndim == 1
            assert shard.data.tobytes() == _expected(view, origin, shape), (kind, origin, shape)


def test_a_box_in_one_run_is_a_view_and_others_are_copies():
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    layout = _core.LeafLayout(0, "float32", [((0, 0), (6, 8))],
                              [(0, (2, 0), (3, 8)), (0, (1, 2), (2, 3)), (0, (4, 3), (1, 4))])
    rows, block, part_of_row = _core.carve_shards([layout], [[base]])
    assert np.shares_memory(rows.data, base)
    assert not np.shares_memory(block.data, base)
    assert np.shares_memory(part_of_row.data, base)  # one row's run is contiguous


def test_views_placed_inside_the_leaf_and_several_leaves_at_once():
    # Two shards of a (6, 4) leaf, each its own array, and a second leaf.
    top, bottom = np.arange(12).reshape(3, 4), np.arange(12, 24).reshape(3, 4)
    first = _core.LeafLayout(0, "int64", [((0, 0), (3, 4)), ((3, 0), (3, 4))],
                             [(1, (3, 1), (2, 2)), (0, (0, 0), (3, 4))])
    second = _core.LeafLayout(1, "int64", [((0,), (5,))], [(0, (1,), (3,))])
    shards = _core.carve_shards([first, second], [[top, bottom], [np.arange(5)]])
    assert [s.leaf for s in shards] == [0, 0, 1]
    assert shards[0].data.view(np.int64).tolist() == [13, 14, 17, 18]
    assert shards[1].data.view(np.int64).tolist() == list(range(12))
    assert shards[2].data.view(np.int64).tolist() == [1, 2, 3]


def test_jax_arrays_of_the_cpu_backend_are_carved_without_numpy():
    for dtype in (jnp.float32, jnp.bfloat16, jnp.int4):
        value = jnp.arange(30).reshape(5, 6).astype(dtype)
        layout = _core.LeafLayout(0, np.dtype(value.dtype).name, [((0, 0), (5, 6))],
                                  [(0, (1, 0), (2, 6)), (0, (0, 1), (5, 2))])
        shards = _core.carve_shards([layout], [[value]])
        host = np.asarray(value)
        assert shards[0].data.tobytes() == _expected(host, (1, 0), (2, 6))
        assert shards[1].data.tobytes() == _expected(host, (0, 1), (5, 2))


def test_staging_copies_put_every_box_in_its_own_aligned_piece_of_the_buffer():
    base = sample_array("bfloat16", shape=(6, 10), seed=5)
    view = base[:, ::2]  # no box of it is one run: each copied row by row
    boxes = [((0, 0), (6, 5)), ((1, 1), (2, 3)), ((5, 4), (1, 1))]
    layouts = [_core.LeafLayout(0, "bfloat16", [((0, 0), (6, 5))],
                                [(0, origin, shape) for origin, shape in boxes]),
               _core.LeafLayout(1, "bfloat16", [((0, 0), (6, 10))], [(0, (2, 0), (3, 10))])]
    sizes = [math.prod(shape) * 2 for _, shape in boxes] + [60]
    buffer = np.zeros(_core.StagingCopies.bytes_needed(sizes), np.uint8)
    copies = _core.StagingCopies(buffer, 2)
    shards = _core.carve_shards(layouts, [[view], [base]], copies)
    copies.finish()
    assert copies.used == buffer.size
    for shard, (origin, shape) in zip(shards, boxes + [((2, 0), (3, 10))]):
        source = view if shard.leaf == 0 else base
        assert shard.data.tobytes() == _expected(source, origin, shape)
        assert np.shares_memory(shard.data, buffer) and not np.shares_memory(shard.data, base)
        assert (shard.data.ctypes.data - buffer.ctypes.data) % 64 == 0  # from the start
    # A device-to-host copy is the save's own already: a view of it, not copied again.
    fresh = np.arange(12, dtype=np.float32)
    own = _core.LeafLayout(2, "float32", [((0,), (12,))], [(0, (0,), (12,))],
                           callers_memory=False)
    used = copies.used
    shard, = _core.carve_shards([own], [[fresh]], copies)
    assert np.shares_memory(shard.data, fresh) and copies.used == used
    too_small = _core.StagingCopies(np.zeros(buffer.size - 1, np.uint8), 1)
    with pytest.raises(RuntimeError, match="staging buffer is too small"):
        _core.carve_shards(layouts, [[view], [base]], too_small)
    too_small.finish()


def test_layouts_and_views_that_do_not_match_are_named():
    with pytest.raises(InvalidArgumentError, match=r"leaf #3: box \[2:5\] does not lie inside"):
        _core.LeafLayout(3, "float32", [((0,), (4,))], [(0, (2,), (3,))])
    with pytest.raises(InvalidArgumentError, match="names view 1 of 1"):
        _core.LeafLayout(3, "float32", [((0,), (4,))], [(1, (0,), (1,))])
    layout = _core.LeafLayout(3, "float32", [((0, 0), (2, 3))], [(0, (0, 0), (2, 3))])
    with pytest.raises(InvalidArgumentError, match=r"leaf #3: view 0 has shape \(3, 2\)"):
        _core.carve_shards([layout], [[np.zeros((3, 2), np.float32)]])
    with pytest.raises(InvalidArgumentError, match=r"\(2, 3\) and 8-byte items, the layout says"):
        _core.carve_shards([layout], [[np.zeros((2, 3), np.float64)]])
    with pytest.raises(InvalidArgumentError, match="2 views, the layout has 1"):
        _core.carve_shards([layout], [[np.zeros((2, 3), np.float32)] * 2])
    with pytest.raises(InvalidArgumentError, match="big-endian"):
        _core.carve_shards([layout], [[np.zeros((2, 3), ">f4")]])
    with pytest.raises(TypeError, match="leaf #3: view 0 is a str, not a host array"):
        _core.carve_shards([layout], [["not an array"]])


# Saves through the native staging, loaded back: every shard of every
# sharding a box can be carved from.

def _shardings():
    mesh = make_mesh((2, 4), ("data", "model"))
    return {
        "rows": NamedSharding(mesh, P(("data", "model"))),
        "grid": NamedSharding(mesh, P("data", "model")),
        "replicated": NamedSharding(mesh, P()),
        "partly_replicated": NamedSharding(mesh, P("data")),  # 4 copies of each half
        "last_axis": NamedSharding(mesh, P(None, "model")),
    }


@pytest.mark.parametrize("replica_parallel", [False, True])
@pytest.mark.parametrize("name", ["float32", "bfloat16", "int4", "uint4"])
def test_sharded_saves_load_back_bit_for_bit(ckpt, name, replica_parallel):
    tree, expected = {}, {}
    for key, sharding in _shardings().items():
        host = sample_array(name, shape=(8, 12), seed=len(tree))
        tree[key] = jax.device_put(host, sharding)
        expected[key] = host
    odd = sample_array(name, shape=(5, 7, 3), seed=99)  # extents no mesh axis divides
    tree["odd"], expected["odd"] = jax.device_put(odd, _shardings()["replicated"]), odd
    sk.save(ckpt, tree, options=sk.Options(replica_parallel=replica_parallel))
    out = sk.load(ckpt)
    for key, host in expected.items():
        assert_same_bits(out[key], host)


def test_non_contiguous_numpy_leaves_saved_as_their_values(ckpt):
    base = sample_array("bfloat16", shape=(9, 10), seed=4)
    tree = {kind: view for kind, view in _views_of(base).items()}
    tree["big_endian"] = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::-1]
    sk.save(ckpt, tree)
    out = sk.load(ckpt)
    for key, value in tree.items():
        np.testing.assert_array_equal(np.asarray(out[key]), value)
        assert_same_bits(out[key], np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")))


def test_async_saves_copy_leaves_the_front_converts_for_the_core(ckpt):
    # A big-endian leaf, a numpy scalar and typed keys are staged from
    # arrays made for the save: their copies must finish before those go.
    big_endian = np.arange(40000, dtype=">f4").reshape(200, 200)
    tree = {"big_endian": big_endian, "scalar": np.float32(3.5),
            "keys": jax.random.split(jax.random.key(7), 4),
            "plain": jnp.arange(1 << 16, dtype=jnp.float32)}
    sk.save_async(ckpt, tree).result()
    out = sk.load(ckpt)
    np.testing.assert_array_equal(out["big_endian"], big_endian)
    assert out["scalar"] == np.float32(3.5)
    assert_same_bits(jax.random.key_data(out["keys"]), jax.random.key_data(tree["keys"]))
    assert_same_bits(out["plain"], np.arange(1 << 16, dtype=np.float32))
