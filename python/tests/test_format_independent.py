"""Reads shardkeep's on-disk format with nothing but docs/FORMAT.md.

This reader shares no code with shardkeep: it decodes the chunk index with
`struct`, checks checksums with the `xxhash` package and reassembles arrays
with numpy, so a bug that the C++ encoder and decoder share (a wrong offset,
a byte-order slip) shows up here.
"""

import json
import pathlib
import struct

import numpy as np
import xxhash

from index_reader import read_index
from record_checksums import file_checksum, own_checksum

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "cpp" / "testdata" / "format"
GOLDEN_INDEX = GOLDEN / "golden_p0.idx"


def test_golden_records_carry_their_own_checksum():
    for name in ("golden_SHARDKEEP", "golden_generation_SHARDKEEP"):
        record = (GOLDEN / name).read_bytes()
        assert json.loads(record)["version"] == 2
        stated, actual = own_checksum(record)
        assert stated == actual, name
    # Version 1 records have none.
    assert own_checksum((GOLDEN / "golden_v1_SHARDKEEP").read_bytes()) is None


def test_golden_index_matches_format_doc():
    data = GOLDEN_INDEX.read_bytes()
    assert len(data) == 216
    assert data[:8] == bytes.fromhex("534b494458000001")
    assert struct.unpack_from("<Q", data, 208)[0] == 0x8F95773659DFDCC7
    records = read_index(data)
    # The table "Golden file" in docs/FORMAT.md section 2.
    assert records == [
        dict(leaf=0, rank=2, data_file=0, codec=0, offset=0,
             stored_length=96, raw_length=96, checksum=0x1122334455667788,
             origin=[0, 0], shape=[4, 6]),
        dict(leaf=2, rank=1, data_file=1, codec=1, offset=0x123456789,
             stored_length=0x1234, raw_length=0x200000000,
             checksum=0xFEDCBA9876543210,
             origin=[0x300000000], shape=[0x100000000]),
        dict(leaf=1, rank=0, data_file=0, codec=0, offset=96,
             stored_length=4, raw_length=4, checksum=0x0A0B0C0D0E0F1011,
             origin=[], shape=[]),
    ]


def test_saved_checkpoint_reads_back_independently(tmp_path):
    import shardkeep  # the package under test; only used to write

    tree = {"a": np.arange(24, dtype=np.float32).reshape(4, 6),
            "b": {"c": np.ones((3,), np.int16)}}
    ckpt = tmp_path / "ckpt"
    shardkeep.save(str(ckpt), tree)

    # _SHARDKEEP: the commit record (FORMAT.md section 3).
    record = (ckpt / "_SHARDKEEP").read_bytes()
    commit = json.loads(record)
    assert commit["format"] == "shardkeep"
    assert commit["version"] == 2
    assert commit["process_count"] == 1
    assert list(commit)[-1] == "checksum"
    stated, actual = own_checksum(record)
    assert stated == actual == commit["checksum"]
    assert commit["checkpointables"] == {"state": {
        "kind": "pytree",
        "meta_checksum": file_checksum((ckpt / "state" / "meta.json").read_bytes())}}
    assert commit["index_files"] == {"state": ["index/p0.idx"]}

    # meta.json: structure and leaf specs (FORMAT.md section 4).
    state = ckpt / "state"
    meta = json.loads((state / "meta.json").read_text())
    assert meta["kind"] == "pytree"
    root = meta["tree"]
    assert root["type"] == "dict" and root["keys"] == ["a", "b"]
    assert root["children"][1]["type"] == "dict"
    assert root["children"][1]["keys"] == ["c"]
    leaves = meta["leaves"]
    by_path = {leaf["path"]: i for i, leaf in enumerate(leaves)}
    assert sorted(by_path) == ["a", "b/c"]
    expected = {"a": tree["a"], "b/c": tree["b"]["c"]}
    for path, array in expected.items():
        leaf = leaves[by_path[path]]
        assert leaf["kind"] == "array"
        assert leaf["dtype"] == array.dtype.name
        assert leaf["shape"] == list(array.shape)
    assert root["children"][0] == {"type": "leaf", "leaf": by_path["a"]}
    assert (root["children"][1]["children"][0]
            == {"type": "leaf", "leaf": by_path["b/c"]})

    # The index and the data files (FORMAT.md sections 2 and 5).
    records = read_index((state / "index" / "p0.idx").read_bytes())
    rebuilt = {i: np.zeros(leaves[i]["shape"], np.dtype(leaves[i]["dtype"]))
               for i in by_path.values()}
    covered = {i: np.zeros(leaves[i]["shape"], np.int32)
               for i in by_path.values()}
    data_files = {}
    for r in records:
        assert r["leaf"] in rebuilt
        leaf = leaves[r["leaf"]]
        dtype = np.dtype(leaf["dtype"]).newbyteorder("<")
        assert r["codec"] == 0, "default options store chunks uncompressed"
        assert r["rank"] == len(leaf["shape"])
        for o, s, extent in zip(r["origin"], r["shape"], leaf["shape"]):
            assert o + s <= extent
        n = int(np.prod(r["shape"], dtype=np.int64))
        assert r["raw_length"] == r["stored_length"] == n * dtype.itemsize
        name = f"p0-{r['data_file']}.bin"
        if name not in data_files:
            data_files[name] = (state / "data" / name).read_bytes()
        blob = data_files[name]
        assert r["offset"] + r["stored_length"] <= len(blob)
        stored = blob[r["offset"]:r["offset"] + r["stored_length"]]
        assert xxhash.xxh3_64_intdigest(stored) == r["checksum"]
        box = tuple(slice(o, o + s) for o, s in zip(r["origin"], r["shape"]))
        rebuilt[r["leaf"]][box] = np.frombuffer(stored, dtype).reshape(
            r["shape"])
        covered[r["leaf"]][box] += 1

    for path, array in expected.items():
        i = by_path[path]
        assert (covered[i] == 1).all(), f"{path}: not covered exactly once"
        np.testing.assert_array_equal(rebuilt[i], array)
        assert rebuilt[i].dtype == array.dtype
