"""Every byte of the commit record, of each meta.json and of each value
file is covered by a checksum (format version 2, docs/FORMAT.md section 3):
a bit flipped anywhere in them is refused with CorruptionError naming the
file, where before a flip inside a number or a name was read as data."""

import pathlib

import numpy as np
import pytest

import shardkeep as sk

FILES = ["_SHARDKEEP", "state/meta.json", "config/meta.json", "config/value.json",
         "blob/meta.json", "blob/value.bin"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("checksummed") / "ckpt"
    sk.save_checkpointables(
        str(path), {"state": {"w": np.arange(6.0).reshape(2, 3), "n": 3, "s": "x"},
                    "config": sk.JsonValue({"lr": 0.5}), "blob": b"xy"}, step=12)
    return path


@pytest.mark.parametrize("name", FILES)
def test_every_flipped_bit_is_refused_naming_the_file(small, name):
    file = small / name
    intact = file.read_bytes()
    load = sk.load if name.startswith(("state/", "_")) else sk.load_checkpointables
    try:
        for i in range(len(intact)):
            flipped = bytearray(intact)
            flipped[i] ^= 1 << (i % 8)
            file.write_bytes(bytes(flipped))
            with pytest.raises(sk.CorruptionError) as info:
                load(str(small))
            assert str(file) in str(info.value), (i, str(info.value))
    finally:
        file.write_bytes(intact)
    loaded = sk.load_checkpointables(str(small))
    assert loaded["config"] == {"lr": 0.5} and loaded["blob"] == b"xy"
    np.testing.assert_array_equal(loaded["state"]["w"], np.arange(6.0).reshape(2, 3))


def test_a_change_that_still_decodes_is_refused_by_the_checksum(small):
    # The string leaf's value lives in meta.json: "x" -> "y" is still a
    # valid document, and was loaded as "y" before meta.json had a checksum.
    file = small / "state" / "meta.json"
    intact = file.read_bytes()
    assert intact.count(b'"value": "x"') == 1
    try:
        file.write_bytes(intact.replace(b'"value": "x"', b'"value": "y"'))
        with pytest.raises(sk.CorruptionError, match="checksum mismatch") as info:
            sk.load(str(small))
        assert str(file) in str(info.value) and "_SHARDKEEP" in str(info.value)
    finally:
        file.write_bytes(intact)
