"""Reader.ranges: the byte ranges of data files a read of each box fetches,
known from the index alone, so that another process can fetch exactly those
bytes (load-and-broadcast, peers' copies) before the read."""

import os
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import make_mesh
from shardkeep import _core
from shardkeep.errors import IncompatibleError, NotFoundError


@pytest.fixture
def saved(ckpt):
    """A (64, 48) float32 leaf "w" stored as 8 row blocks, and "b"."""
    mesh = make_mesh((8,), ("x",))
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.integers(0, 100, (8, 16), dtype=np.int32)
    sk.save(ckpt, {"w": jax.device_put(w, NamedSharding(mesh, P("x"))), "b": b})
    reader = _core.Reader(ckpt)
    number = {leaf.path: i
              for i, leaf in enumerate(reader.pytree("state").leaves)}
    return reader, number, w, b


def test_a_box_is_the_chunks_holding_it_and_a_whole_leaf_all_of_them(saved, ckpt):
    reader, number, w, _ = saved
    w_leaf = number["w"]
    whole, rows, one_block = (_spans(one) for one in reader.ranges("state", [
        _core.ReadRequest(w_leaf, "float32", [0, 0], [64, 48]),
        _core.ReadRequest(w_leaf, "float32", [6, 5], [4, 10]),   # rows 6-9: two row blocks
        _core.ReadRequest(w_leaf, "float32", [8, 0], [8, 48])]))
    assert sum(length for _, _, length in whole) == w.nbytes
    assert len(whole) == 8 and whole == sorted(whole)
    assert all(file.startswith(ckpt) and os.path.isfile(file) for file, _, _ in whole)
    assert len(rows) == 2 and all(r in whole for r in rows)
    # A box that is one raw chunk is where locate finds it, with its checksum.
    [found] = reader.locate("state", [_core.ReadRequest(w_leaf, "float32", [8, 0], [8, 48])])
    assert found is not None and found.checksum is not None
    assert one_block == [(found.file, found.offset, found.length)]
    # Requests are checked as for a read.
    with pytest.raises(IncompatibleError, match="outside the stored shape"):
        reader.ranges("state", [_core.ReadRequest(w_leaf, "float32", [60, 0], [8, 48])])


def _spans(ranges: list[_core.StoredRange]) -> list[tuple[str, int, int]]:
    assert all(r.checksum is not None for r in ranges)  # each a whole chunk, as stored
    return [(r.file, r.offset, r.length) for r in ranges]


def test_fetching_only_the_ranges_is_enough_to_read(saved, ckpt, tmp_path):
    reader, number, w, _ = saved
    request = _core.ReadRequest(number["w"], "float32", [20, 3], [17, 40])
    [ranges] = map(_spans, reader.ranges("state", [request]))
    # A copy whose data files are zeros, except the reported ranges.
    copy = str(tmp_path / "copy")
    shutil.copytree(ckpt, copy)
    for folder, _, files in os.walk(os.path.join(copy, "state", "data")):
        for name in files:
            path = os.path.join(folder, name)
            size = os.path.getsize(path)
            with open(path, "wb") as f:
                f.truncate(size)
    for file, offset, length in ranges:
        with open(file, "rb") as src, open(copy + file[len(ckpt):], "r+b") as dst:
            src.seek(offset)
            dst.seek(offset)
            dst.write(src.read(length))
    out = np.zeros((17, 40), np.float32)
    request.buffer = out.reshape(-1).view(np.uint8)
    _core.Reader(copy).read("state", [request])
    np.testing.assert_array_equal(out, w[20:37, 3:43])


def test_needs_no_data_file(saved, ckpt):
    reader, number, _, _ = saved
    request = _core.ReadRequest(number["b"], "int32", [0, 0], [8, 16])
    [before] = map(_spans, reader.ranges("state", [request]))
    shutil.rmtree(os.path.join(ckpt, "state", "data"))
    fresh = _core.Reader(ckpt)
    assert list(map(_spans, fresh.ranges("state", [request]))) == [before]
    out = np.zeros((8, 16), np.int32)
    request.buffer = out.reshape(-1).view(np.uint8)
    with pytest.raises(NotFoundError, match=before[0][0]):
        fresh.read("state", [request])
