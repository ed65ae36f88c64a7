"""Checkpoints written by earlier versions keep loading, bit for bit.

cpp/testdata/compat/v<N> holds checkpoints written by format version N
(scripts/make_compat_checkpoints.py, 4 processes, every dtype, raw and
zstd, each kind of checkpointable). A format change bumps the version and
adds a folder; the old folders stay and this test keeps loading them.
"""

import json
import pathlib
import sys

import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits
from index_reader import read_index

sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
import compat_checkpoint as compat  # noqa: E402

COMPAT = pathlib.Path(__file__).resolve().parents[2] / "cpp" / "testdata" / "compat"
CHECKPOINTS = sorted(p.parent for p in COMPAT.glob("v*/*/_SHARDKEEP"))
FULL = [p for p in CHECKPOINTS if p.name != "small"]


def test_every_version_and_codec_is_present():
    assert {p.relative_to(COMPAT).as_posix() for p in CHECKPOINTS} >= {
        f"v{n}/{name}" for n in (1, 2, 3) for name in ("raw", "zstd", "small")}


def _compressed_codec(version: int) -> int:
    """The codec a version's compressed chunks use: zstd of the elements
    until version 3, zstd of their byte planes from it on."""
    return 1 if version < 3 else 2


@pytest.mark.parametrize("version", sorted(p.name for p in COMPAT.glob("v*")))
def test_small_checkpoint_loads_bit_exactly(version):
    path = COMPAT / version / "small"
    assert json.loads((path / "_SHARDKEEP").read_text())["version"] == int(version[1:])
    loaded = sk.load_checkpointables(str(path))
    _assert_same_tree(loaded["state"], compat.expected_small_tree())
    assert loaded["config"] == {"a": 1} and loaded["blob"] == b"xy"
    codecs = {r["codec"] for r in read_index((path / "state/index/p0.idx").read_bytes())}
    assert codecs == {0, _compressed_codec(int(version[1:]))}


def _assert_same_tree(actual, expected, where="state"):
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected), where
        for key in expected:
            _assert_same_tree(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, tuple):
        assert type(actual).__name__ == type(expected).__name__, where
        assert getattr(actual, "_fields", None) == getattr(expected, "_fields", None), where
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_same_tree(a, e, f"{where}/{i}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_same_tree(a, e, f"{where}/{i}")
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert_same_bits(np.asarray(actual), np.asarray(expected))
    else:
        assert type(actual) is type(expected) and actual == expected, where


@pytest.mark.parametrize("path", FULL, ids=lambda p: p.relative_to(COMPAT).as_posix())
def test_compat_checkpoint_loads_bit_exactly(path):
    commit = json.loads((path / "_SHARDKEEP").read_text())
    assert commit["version"] == int(path.parent.name[1:])
    assert commit["process_count"] == 4 and commit["step"] == 1200
    assert {name: c["kind"] for name, c in commit["checkpointables"].items()} == {
        "state": "pytree", "config": "json", "blob": "bytes"}
    codecs = {r["codec"] for f in (path / "state" / "index").iterdir()
              for r in read_index(f.read_bytes())}
    compressed = _compressed_codec(commit["version"])
    assert codecs == ({0, compressed} if path.name == "zstd" else {0})

    loaded = sk.load_checkpointables(str(path))
    _assert_same_tree(loaded["state"], compat.expected_tree())
    assert loaded["config"] == compat.EXPECTED_JSON
    assert loaded["blob"] == compat.EXPECTED_BYTES
    # Every dtype, stored as the name it was saved under.
    meta = json.loads((path / "state" / "meta.json").read_text())
    assert {leaf["dtype"] for leaf in meta["leaves"] if leaf["path"].startswith("arrays/")} == \
        set(compat.DTYPES)
