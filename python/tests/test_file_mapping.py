"""Loads that map raw chunks of the checkpoint's files (Options.map_files)."""

import glob
import os
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import shardkeep as sk
from file_edits import flip_byte
from index_reader import read_index
from shardkeep import _core

MAPPED = sk.Options(map_files=True)
READ = sk.Options(map_files=False)


def _state():
    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    rng = np.random.default_rng(0)
    return {"w": jax.device_put(rng.standard_normal((64, 48)).astype(np.float32), sharding),
            "b": rng.integers(0, 100, (8, 16), dtype=np.int32)}


def _target(state):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                       sharding=getattr(a, "sharding", None))
                        if isinstance(a, jax.Array) else a, state)


def test_each_shard_stored_as_one_raw_chunk_is_located_in_its_data_file(ckpt):
    sk.save(ckpt, _state())
    reader = _core.Reader(ckpt)
    number = {leaf.path: i
              for i, leaf in enumerate(reader.pytree("state").leaves)}
    b, w = number["b"], number["w"]
    requests = [_core.ReadRequest(b, "int32", [0, 0], [8, 16]),
                _core.ReadRequest(w, "float32", [8, 0], [8, 48]),
                _core.ReadRequest(w, "float32", [4, 0], [8, 48]),   # spans two stored chunks
                _core.ReadRequest(w, "float64", [8, 0], [8, 48])]   # a cast: must be read
    found = reader.locate("state", requests)
    assert found[2] is None and found[3] is None
    for request, hit in zip(requests[:2], found[:2]):
        assert hit is not None
        assert os.path.isfile(hit.file) and hit.file.startswith(ckpt)
        assert hit.length == 4 * request.shape[0] * request.shape[1]
        with open(hit.file, "rb") as f:
            f.seek(hit.offset)
            assert _core.checksum(np.frombuffer(f.read(hit.length), np.uint8)) == hit.checksum


@pytest.mark.parametrize("with_target", [True, False])
def test_mapped_load_equals_read_load_and_survives_deletion(ckpt, with_target):
    state = _state()
    sk.save(ckpt, state)
    target = _target(state) if with_target else None
    mapped = sk.load(ckpt, target, options=MAPPED)
    read = sk.load(ckpt, target, options=READ)
    shutil.rmtree(ckpt)  # mapped arrays keep their (deleted) files alive
    for key in ("w", "b"):
        np.testing.assert_array_equal(np.asarray(mapped[key]), np.asarray(state[key]))
        np.testing.assert_array_equal(np.asarray(read[key]), np.asarray(state[key]))
    if with_target:
        assert mapped["w"].sharding == state["w"].sharding


def test_mapped_numpy_leaves_are_private_copies_on_write(ckpt):
    sk.save(ckpt, {"a": np.arange(4096, dtype=np.float32)})
    first = sk.load(ckpt, options=MAPPED)["a"]
    first[:] = -1  # writes go to private pages, not to the file
    second = sk.load(ckpt, options=MAPPED)["a"]
    np.testing.assert_array_equal(second, np.arange(4096, dtype=np.float32))


def test_flipped_byte_in_a_mapped_chunk_is_corruption_naming_leaf_and_file(ckpt):
    sk.save(ckpt, {"layer": {"kernel": np.arange(4096, dtype=np.float32)}},
            options=sk.Options(io_threads=1))
    (data_file,) = glob.glob(os.path.join(ckpt, "state", "data", "*.bin"))
    reader = _core.Reader(ckpt)
    assert reader.locate("state", [_core.ReadRequest(0, "float32", [0], [4096])])[0] is not None
    flip_byte(data_file, 5000)
    with pytest.raises(sk.CorruptionError) as info:
        sk.load(ckpt, options=MAPPED)
    message = str(info.value)
    assert "layer/kernel" in message and os.path.basename(data_file) in message


@pytest.mark.parametrize("options", [MAPPED, READ], ids=["mapped", "read"])
def test_a_missing_data_file_is_a_shardkeep_error_naming_it(ckpt, options):
    sk.save(ckpt, {"layer": {"kernel": np.arange(4096, dtype=np.float32)}},
            options=sk.Options(io_threads=1))
    (data_file,) = glob.glob(os.path.join(ckpt, "state", "data", "*.bin"))
    os.remove(data_file)
    with pytest.raises(sk.ShardkeepError) as info:
        sk.load(ckpt, options=options)
    assert os.path.basename(data_file) in str(info.value)


def test_chunks_start_at_64_byte_offsets_so_odd_sizes_do_not_stop_mapping(ckpt):
    # A 4-byte scalar and a 3-byte array written first would shift every
    # later chunk of the file off alignment without padding.
    tree = {"a": np.int32(7), "b": np.ones(3, np.uint8),
            "c": np.arange(1000, dtype=np.float32), "d": np.arange(77, dtype=np.int16)}
    sk.save(ckpt, tree, options=sk.Options(io_threads=1))
    with open(os.path.join(ckpt, "state", "index", "p0.idx"), "rb") as f:
        records = read_index(f.read())
    assert len(records) == 4
    assert all(r["offset"] % 64 == 0 for r in records)
    reader = _core.Reader(ckpt)
    leaves = reader.pytree("state").leaves
    requests = [_core.ReadRequest(i, leaf.dtype, [0] * len(leaf.shape), leaf.shape)
                for i, leaf in enumerate(leaves)]
    assert all(found is not None for found in reader.locate("state", requests))
    loaded = sk.load(ckpt, options=MAPPED)
    for key, value in tree.items():
        np.testing.assert_array_equal(loaded[key], value)
