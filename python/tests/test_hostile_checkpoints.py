"""Checkpoints whose checksums are all right but whose contents lie.

Each is refused with CorruptionError naming the file (and the leaf or the
tree node), never loaded as wrong values or failing with KeyError or
IndexError.
"""

import json
import os

import numpy as np
import pytest

import shardkeep as sk
from shardkeep import _core
from index_reader import read_index, write_index
from record_checksums import relist


def _meta_path(ckpt):
    return os.path.join(ckpt, "state", "meta.json")


def _edit_meta(ckpt, edit):
    with open(_meta_path(ckpt)) as f:
        meta = json.load(f)
    edit(meta)
    with open(_meta_path(ckpt), "w") as f:
        json.dump(meta, f)
    relist(ckpt)  # as a producer of the edited file would


@pytest.fixture
def saved(ckpt):
    """{"a": [x, y], "b": z} saved; leaves a/0, a/1, b are 0, 1, 2."""
    sk.save(ckpt, {"a": [np.arange(4.0), np.arange(3.0)], "b": np.ones(2, np.int32)})
    return ckpt


@pytest.mark.parametrize("edit, node", [
    # a/1 points at leaf 0 too: a/0's values would appear twice.
    pytest.param(lambda m: m["tree"]["children"][0]["children"][1].update(leaf=0),
                 "/tree/children/0/children/1", id="repeated_leaf"),
    pytest.param(lambda m: m["tree"]["children"][1].update(leaf=-1), "/tree/children/1",
                 id="negative_leaf"),
    pytest.param(lambda m: m["tree"]["children"][1].update(leaf=7), "/tree/children/1",
                 id="leaf_out_of_range"),
    # A dict with a key but its child missing (zip would drop "b" silently).
    pytest.param(lambda m: m["tree"]["children"].pop(), "/tree", id="missing_child"),
    pytest.param(lambda m: m["tree"]["keys"].append("c"), "/tree", id="extra_key"),
    pytest.param(lambda m: m["tree"]["children"][0].pop("children"), "/tree/children/0",
                 id="no_children"),
    pytest.param(lambda m: m["tree"].update(type="frozenset"), "/tree", id="unknown_type"),
])
def test_invalid_tree_is_corruption_naming_the_node(saved, edit, node):
    _edit_meta(saved, edit)
    with pytest.raises(sk.CorruptionError) as info:
        sk.load(saved)
    message = str(info.value)
    assert _meta_path(saved) in message and f"tree node {node}" in message


def test_unreferenced_leaf_is_corruption(saved):
    def drop_b(meta):
        meta["tree"]["keys"].pop()
        meta["tree"]["children"].pop()
    _edit_meta(saved, drop_b)
    with pytest.raises(sk.CorruptionError, match="leaf 2 is not referenced"):
        sk.load(saved)


def test_duplicated_plus_missing_record_is_corruption_naming_leaf_and_file(ckpt):
    # Four chunks of four rows; rows 8-11 stored twice and rows 12-15
    # never, so the element counts still add up.
    sk.save(ckpt, {"w": np.arange(64, dtype=np.float32).reshape(16, 4)},
            options=sk.Options(chunk_bytes=64, io_threads=1))
    index_file = os.path.join(ckpt, "state", "index", "p0.idx")
    with open(index_file, "rb") as f:
        records = sorted(read_index(f.read()), key=lambda r: r["origin"])
    assert [r["origin"] for r in records] == [[0, 0], [4, 0], [8, 0], [12, 0]]
    records[3] = records[2]
    with open(index_file, "wb") as f:
        f.write(write_index(records))
    with pytest.raises(sk.CorruptionError) as info:
        sk.load(ckpt)
    message = str(info.value)
    assert "leaf 'w'" in message and index_file in message and "overlaps" in message


def test_leaf_over_2_to_63_bytes_is_corruption(saved):
    # 2^61 float64 elements: 2^64 bytes, which wrapped to 0 before.
    _edit_meta(saved, lambda m: m["leaves"][2].update(dtype="float64", shape=[2**61]))
    with pytest.raises(sk.CorruptionError, match="more than 2\\^63 bytes"):
        sk.load(saved)


def test_read_request_whose_size_overflows_is_refused(saved):
    reader = _core.Reader(saved)
    request = _core.ReadRequest(0, "float64", [0], [2**61], np.empty(0, np.uint8))
    with pytest.raises(sk.InvalidArgumentError, match="overflows 64 bits"):
        reader.read("state", [request])
