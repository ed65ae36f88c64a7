"""The command-line tool's data commands (docs/CLI.md): `verify`, `cp` and
`export`, run as the installed program on checkpoints saved from Python.

The program is the one `pip install .` puts beside this Python
(.venv/bin/shardkeep); without it the tests fail rather than skip.
"""

from __future__ import annotations

import json
import os
import pathlib
import pty
import select
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import shardkeep as sk
from conftest import assert_same_bits, sample_array
from index_reader import read_index


def shardkeep_program() -> str:
    program = pathlib.Path(sys.executable).with_name("shardkeep")
    if not program.is_file():
        pytest.fail(f"the shardkeep command-line tool is not installed at {program}: run "
                    "`pip install --no-build-isolation .` (scripts/setup.sh does)",
                    pytrace=False)
    return str(program)


def run(*args: str, stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([shardkeep_program(), *args], stdout=subprocess.PIPE, stderr=stderr,
                          text=True, timeout=300, check=False)


def files_under(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def data_files(ckpt: str) -> list[pathlib.Path]:
    return sorted(pathlib.Path(ckpt, "state", "data").glob("*.bin"))


# One writer thread: every chunk in one data file.
ONE_FILE = sk.Options(io_threads=1)


def small_tree():
    return {"w": sample_array("float32", (64, 16)), "b": sample_array("int32", (100,)),
            "step": 3}


# -- verify -------------------------------------------------------------------

def test_verify_intact_checkpoint_exits_0_quietly(ckpt):
    sk.save(ckpt, small_tree())
    result = run("verify", ckpt)
    assert result.returncode == 0, result.stderr
    assert "intact" in result.stdout
    assert result.stderr == ""  # not a terminal: no progress bar

    result = run("verify", "--json", "--threads", "2", ckpt)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert report["chunks_checked"] >= 2
    assert report["bytes_checked"] == 64 * 16 * 4 + 100 * 4


def test_verify_lists_every_problem_with_file_leaf_and_offset(ckpt):
    sk.save(ckpt, small_tree(), options=sk.Options(chunk_bytes=1024, io_threads=1))
    [data] = data_files(ckpt)
    records = read_index(pathlib.Path(ckpt, "state", "index", "p0.idx").read_bytes())
    first, last = sorted(records, key=lambda r: r["offset"])[::len(records) - 1]
    damaged = bytearray(data.read_bytes())
    damaged[first["offset"]] ^= 0xFF
    damaged[last["offset"] + last["stored_length"] - 1] ^= 0xFF
    data.write_bytes(bytes(damaged))

    result = run("verify", "--json", ckpt)
    assert result.returncode == 1, result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 2, problems
    assert [p["offset"] for p in problems] == [first["offset"], last["offset"]]
    for problem in problems:
        assert problem["file"].endswith(f"state/data/{data.name}")
        assert problem["checkpointable"] == "state"
        assert problem["leaf"] in ("w", "b")
        assert "checksum mismatch" in problem["message"]

    text = run("verify", ckpt)
    assert text.returncode == 1
    assert "2 problems" in text.stdout and f"offset: {last['offset']}" in text.stdout


def test_verify_reports_a_missing_index_and_a_truncated_data_file(ckpt):
    sk.save(ckpt, small_tree(), options=ONE_FILE)
    [data] = data_files(ckpt)
    data.write_bytes(data.read_bytes()[:10])
    result = run("verify", "--json", ckpt)
    assert result.returncode == 1
    messages = [p["message"] for p in json.loads(result.stdout)["problems"]]
    assert messages and all("past the end of the file (10 bytes)" in m for m in messages)

    pathlib.Path(ckpt, "state", "index", "p0.idx").unlink()
    result = run("verify", "--json", ckpt)
    assert result.returncode == 1
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["file"].endswith("state/index/p0.idx") and "is missing" in problem["message"]


def test_verify_without_a_checkpoint_exits_3(tmp_path):
    result = run("verify", str(tmp_path / "nothing"))
    assert result.returncode == 3
    assert "_SHARDKEEP" in result.stderr


def test_progress_bar_is_drawn_on_a_terminal(ckpt):
    sk.save(ckpt, small_tree())
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen([shardkeep_program(), "verify", ckpt],
                                   stdout=subprocess.PIPE, stderr=terminal)
        os.close(terminal)
        drawn = b""
        while True:
            ready, _, _ = select.select([controller], [], [], 60)
            if not ready:
                break
            try:
                piece = os.read(controller, 4096)
            except OSError:  # the program closed the terminal
                break
            if not piece:
                break
            drawn += piece
        assert process.wait(60) == 0
    finally:
        os.close(controller)
    assert b"verify [" in drawn and b"100%" in drawn, drawn
    assert b"\r" in drawn  # redrawn in place


# -- cp -----------------------------------------------------------------------

def test_cp_round_trip_through_s3_is_bit_exact(ckpt, s3, tmp_path):
    tree = {"w": sample_array("bfloat16", (128, 64)), "k": sample_array("int8", (1000,))}
    sk.save(ckpt, tree, step=5, options=sk.Options(chunk_bytes=4096, compression="zstd"))
    remote = s3.url("copies/5")
    back = tmp_path / "back"

    result = run("cp", ckpt, remote)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "copies/5/_SHARDKEEP" in s3.keys("copies/5/")
    assert run("verify", remote).returncode == 0
    result = run("cp", remote, str(back))
    assert result.returncode == 0, result.stderr

    assert files_under(back) == files_under(pathlib.Path(ckpt))
    loaded = sk.load(str(back))
    assert_same_bits(loaded["w"], tree["w"])
    assert_same_bits(loaded["k"], tree["k"])


def test_cp_refuses_an_existing_destination_unless_forced(ckpt, tmp_path):
    sk.save(ckpt, {"a": np.arange(10)})
    other = tmp_path / "other"
    sk.save(str(other), {"a": np.zeros(3)})
    result = run("cp", ckpt, str(other))
    assert result.returncode == 3
    assert "already committed" in result.stderr and "--force" in result.stderr
    assert_same_bits(sk.load(str(other))["a"], np.zeros(3))

    assert run("cp", "--force", ckpt, str(other)).returncode == 0
    assert_same_bits(sk.load(str(other))["a"], np.arange(10))


def test_cp_of_a_damaged_checkpoint_fails_and_leaves_nothing(ckpt, tmp_path):
    sk.save(ckpt, small_tree(), options=ONE_FILE)
    [data] = data_files(ckpt)
    damaged = bytearray(data.read_bytes())
    damaged[5] ^= 1
    data.write_bytes(bytes(damaged))
    result = run("cp", ckpt, str(tmp_path / "copy"))
    assert result.returncode == 3
    assert "checksum mismatch" in result.stderr
    assert list(tmp_path.glob("copy*")) == []


# -- export -------------------------------------------------------------------

# safetensors' dtype names and the numpy dtypes that hold them.
NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "I32": np.int32, "U32": np.uint32, "I64": np.int64, "U64": np.uint64,
    "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}


def read_with_numpy(path: pathlib.Path) -> dict[str, np.ndarray]:
    """A safetensors file parsed with nothing but struct, json and numpy."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    arrays, end = {}, 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        begin, stop = spec["data_offsets"]
        arrays[name] = np.frombuffer(data[begin:stop], NUMPY_DTYPES[spec["dtype"]]) \
            .reshape(spec["shape"])
        end = max(end, stop)
    assert end == len(data)  # the tensors fill the data section exactly
    return arrays


def exported_tree():
    return {
        "params": {
            "dense": {"kernel": sample_array("bfloat16", (32, 24), seed=1),
                      "bias": sample_array("float32", (24,), seed=2)},
            "a/b": sample_array("float16", (5, 3), seed=3),
        },
        "fp8": [sample_array("float8_e4m3fn", (16, 8), seed=4),
                sample_array("float8_e5m2", (7,), seed=5)],
        "ints": {"i32": sample_array("int32", (4, 4, 4), seed=6),
                 "u8": sample_array("uint8", (9,), seed=7),
                 "i64": sample_array("int64", (3,), seed=8)},
        "mask": sample_array("bool", (6, 2), seed=9),
        "scalar0d": np.array(2.5),
        "step": 7,
        "note": "text",
    }


def expected_tensors(tree) -> dict[str, np.ndarray]:
    """The exported names: key paths with '/' as '.', escapes kept."""
    return {
        "params.dense.kernel": tree["params"]["dense"]["kernel"],
        "params.dense.bias": tree["params"]["dense"]["bias"],
        "params.a~1b": tree["params"]["a/b"],
        "fp8.0": tree["fp8"][0], "fp8.1": tree["fp8"][1],
        "ints.i32": tree["ints"]["i32"], "ints.u8": tree["ints"]["u8"],
        "ints.i64": tree["ints"]["i64"],
        "mask": tree["mask"], "scalar0d": tree["scalar0d"],
    }


def test_export_is_read_back_bit_exactly_by_safetensors_and_numpy(ckpt, tmp_path):
    tree = exported_tree()
    sk.save(ckpt, tree, options=sk.Options(chunk_bytes=256))  # many chunks per leaf
    out = tmp_path / "out"
    result = run("export", ckpt, str(out), "--format", "safetensors")
    assert result.returncode == 0, result.stderr
    assert "skipped leaf 'step'" in result.stderr and "skipped leaf 'note'" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    expected = expected_tensors(tree)

    by_numpy = read_with_numpy(out / "model.safetensors")
    assert sorted(by_numpy) == sorted(expected)
    for name, array in expected.items():
        assert_same_bits(by_numpy[name], array)

    by_package = dict(safetensors.deserialize((out / "model.safetensors").read_bytes()))
    assert sorted(by_package) == sorted(expected)
    for name, array in expected.items():
        assert list(by_package[name]["shape"]) == list(array.shape)
        assert bytes(by_package[name]["data"]) == np.ascontiguousarray(array).tobytes(), name
    dtypes = {name: by_package[name]["dtype"] for name in by_package}
    assert dtypes["params.dense.kernel"] == "BF16"
    assert dtypes["fp8.0"] == "F8_E4M3" and dtypes["fp8.1"] == "F8_E5M2"
    # numpy's loader in the package reads the dtypes numpy has.
    with safetensors.safe_open(str(out / "model.safetensors"), framework="np") as f:
        assert sorted(f.keys()) == sorted(expected)
        for name in ("params.dense.bias", "ints.i32", "ints.i64", "mask", "scalar0d"):
            assert_same_bits(f.get_tensor(name), expected[name])


def test_export_splits_large_models_with_a_hugging_face_index(ckpt, tmp_path):
    tree = {f"layer{i}": sample_array("float32", (50, 20), seed=i) for i in range(5)}
    sk.save(ckpt, tree)
    out = tmp_path / "out"
    result = run("export", ckpt, str(out), "--format", "safetensors",
                 "--max-file-size", "8KB")  # two 4000-byte tensors per file
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 50 * 20 * 4
    assert sorted(index["weight_map"]) == sorted(tree)
    seen = {}
    for name, file in index["weight_map"].items():
        tensors = safetensors.numpy.load_file(str(out / file))
        assert name in tensors
        seen[name] = tensors[name]
    for name, array in tree.items():
        assert_same_bits(seen[name], array)

    # A second export into the same folder is refused, then forced.
    again = run("export", ckpt, str(out), "--format", "safetensors")
    assert again.returncode == 3 and "--force" in again.stderr
    forced = run("export", ckpt, str(out), "--format", "safetensors", "--force")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]


def test_export_refuses_dtypes_safetensors_lacks_unless_skipped(ckpt, tmp_path):
    tree = {"q": sample_array("int4", (8, 4)), "w": sample_array("float32", (4,))}
    sk.save(ckpt, tree)
    out = tmp_path / "out"
    refused = run("export", ckpt, str(out), "--format", "safetensors")
    assert refused.returncode == 3
    assert "leaf 'q': dtype int4" in refused.stderr
    assert not out.exists() or list(out.iterdir()) == []

    skipped = run("export", ckpt, str(out), "--format", "safetensors", "--skip-unsupported")
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped leaf 'q'" in skipped.stderr
    tensors = safetensors.numpy.load_file(str(out / "model.safetensors"))
    assert sorted(tensors) == ["w"]
    assert_same_bits(tensors["w"], tree["w"])


def test_export_reads_from_s3(s3, tmp_path):
    tree = {"w": sample_array("bfloat16", (40, 30))}
    sk.save(s3.url("model"), tree)
    out = tmp_path / "out"
    result = run("export", s3.url("model"), str(out), "--format", "safetensors")
    assert result.returncode == 0, result.stderr
    assert_same_bits(read_with_numpy(out / "model.safetensors")["w"], tree["w"])


def test_help_is_available_for_each_data_command():
    for command in ("verify", "cp", "export"):
        result = run(command, "--help")
        assert result.returncode == 0
        assert command in result.stdout
