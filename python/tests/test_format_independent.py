"""Reads shardkeep's on-disk format with nothing but docs/FORMAT.md.

This reader shares no code with shardkeep: it decodes the chunk index with
`struct`, checks checksums with the `xxhash` package, decompresses with the
system's libzstd through ctypes and reassembles arrays with numpy, so a bug that the C++ encoder and decoder share (a wrong offset,
a byte-order slip) shows up here.
"""

import ctypes
import ctypes.util
import json
import pathlib
import struct

import ml_dtypes
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
        assert json.loads(record)["version"] == 3
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
    assert commit["version"] == 3
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


def _zstd_frames(stored: bytes) -> list[bytes]:
    """The decompressed contents of the zstd frames `stored` holds, in order,
    decoded by the system's libzstd, not by shardkeep."""
    lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    for name, result in (("ZSTD_findFrameCompressedSize", ctypes.c_size_t),
                         ("ZSTD_getFrameContentSize", ctypes.c_ulonglong),
                         ("ZSTD_decompress", ctypes.c_size_t)):
        getattr(lib, name).restype = result
    frames, at = [], 0
    while at < len(stored):
        rest = stored[at:]
        length = lib.ZSTD_findFrameCompressedSize(rest, ctypes.c_size_t(len(rest)))
        size = lib.ZSTD_getFrameContentSize(rest, ctypes.c_size_t(length))
        out = ctypes.create_string_buffer(size)
        assert lib.ZSTD_decompress(out, ctypes.c_size_t(size), rest, ctypes.c_size_t(length)) == size
        frames.append(out.raw)
        at += length
    return frames


BLOCK_ELEMENTS = 131072  # FORMAT.md section 5: codec 2 compresses blocks of 2**17 elements


def test_compressed_chunks_decode_as_format_md_says(tmp_path):
    """Codec 2 (FORMAT.md section 5): one zstd frame per block of 2**17
    elements, each of the block's byte planes, plane j holding byte j of
    every element in row-major order."""
    import shardkeep  # the package under test; only used to write

    rng = np.random.default_rng(3)
    tree = {"w": (rng.standard_normal((64, 96)) * 0.02).astype(ml_dtypes.bfloat16),
            "m": rng.standard_normal((48, 80)).astype(np.float32),
            "big": rng.standard_normal(2 * BLOCK_ELEMENTS + 1000).astype(np.float32)}
    ckpt = tmp_path / "ckpt"
    shardkeep.save(str(ckpt), tree, options=shardkeep.Options(compression="zstd"))
    assert json.loads((ckpt / "_SHARDKEEP").read_bytes())["version"] == 3
    state = ckpt / "state"
    leaves = json.loads((state / "meta.json").read_text())["leaves"]
    rebuilt = {leaf["path"]: np.zeros(leaf["shape"], tree[leaf["path"]].dtype) for leaf in leaves}
    frame_counts = {}
    for r in read_index((state / "index" / "p0.idx").read_bytes()):
        path = leaves[r["leaf"]]["path"]
        dtype = tree[path].dtype
        blob = (state / "data" / f"p0-{r['data_file']}.bin").read_bytes()
        stored = blob[r["offset"]:r["offset"] + r["stored_length"]]
        assert xxhash.xxh3_64_intdigest(stored) == r["checksum"]
        assert r["codec"] == 2, "normal float values shrink"
        blocks = []
        for planes in _zstd_frames(stored):
            n = len(planes) // dtype.itemsize
            blocks.append(np.frombuffer(planes, np.uint8).reshape(dtype.itemsize, n).T.tobytes())
        frame_counts[path] = len(blocks)
        raw = b"".join(blocks)
        assert len(raw) == r["raw_length"]
        box = tuple(slice(o, o + s) for o, s in zip(r["origin"], r["shape"]))
        rebuilt[path][box] = np.frombuffer(raw, dtype).reshape(r["shape"])
    assert frame_counts == {"w": 1, "m": 1, "big": 3}
    for path, array in tree.items():
        assert np.array_equal(rebuilt[path].view(np.uint8), array.view(np.uint8)), path
