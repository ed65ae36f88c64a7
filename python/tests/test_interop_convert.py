"""sk.convert's own behaviour: source formats, the pickle opt-in's scope,
the progress line, and the safetensors path (through sk.load_safetensors).
Orbax and DCP conversions are tested with their readers."""

import io
import re
import sys

import ml_dtypes
import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits
from shardkeep.interop.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_unknown_source_format_is_refused(tmp_path):
    with pytest.raises(sk.InvalidArgumentError, match=r"source_format must be one of"):
        sk.convert(tmp_path, str(tmp_path / "out"), source_format="npz")


def test_allow_pickle_is_for_dcp_only(tmp_path):
    with pytest.raises(sk.InvalidArgumentError, match="allow_pickle applies to"):
        sk.convert(tmp_path, str(tmp_path / "out"), source_format="orbax", allow_pickle=True)


def test_safetensors_converts_through_load_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    gen = torch.Generator().manual_seed(11)
    tensors = {"model.layers.0.weight": torch.randn(8, 4, generator=gen).to(torch.bfloat16),
               "model.norm": torch.randn(4, generator=gen)}
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    dst = str(tmp_path / "out")
    sk.convert(tmp_path / "model.safetensors", dst, source_format="safetensors")
    loaded = sk.load(dst)
    assert_same_bits(loaded["model"]["layers"]["0"]["weight"],
                     tensors["model.layers.0.weight"].view(torch.int16).numpy()
                     .view(ml_dtypes.bfloat16))
    assert_same_bits(loaded["model"]["norm"], tensors["model.norm"].numpy())


def test_progress_line_only_on_a_terminal():
    terminal, log = _Terminal(), io.StringIO()
    for stream in (terminal, log):
        progress = Progress("convert x", 2, 2 << 20, stream=stream)
        progress.advance(1, 1 << 20)
        progress.advance(1, 1 << 20)
        progress.finish()
    assert log.getvalue() == ""
    lines = terminal.getvalue().split("\r")
    assert lines[0] == "" and lines[1].startswith("convert x: 1/2 leaves, 1.0/2.0 MiB (50%)")
    assert re.fullmatch(r"convert x: 2/2 leaves, 2\.0/2\.0 MiB \(100%\), [0-9.]+ MiB/s\n",
                        lines[-1])


def test_a_conversion_shows_progress_on_a_terminal(tmp_path, monkeypatch):
    ocp = pytest.importorskip("orbax.checkpoint")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(str(tmp_path / "orbax"), {"a": np.ones((256, 256), np.float32),
                                                    "b": np.zeros(3, np.int8)})
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    sk.convert(tmp_path / "orbax", str(tmp_path / "out"))
    final = terminal.getvalue().split("\r")[-1]
    assert final.startswith(f"convert {tmp_path / 'orbax'}: 2/2 leaves, 0.3/0.3 MiB (100%)")
    assert final.endswith("MiB/s\n")


def test_orbax_custom_metadata_is_kept(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    custom = {"scan_layers": True, "lora": {"rank": 8, "alpha": 16.0}}
    values = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    with ocp.CheckpointManager(str(tmp_path / "run")) as manager:
        manager.save(4, args=ocp.args.StandardSave(values), custom_metadata=custom)
        manager.wait_until_finished()
    with ocp.StandardCheckpointer() as checkpointer:  # one item, no step folder
        checkpointer.save(str(tmp_path / "single"), values, custom_metadata={"note": "x"})
        checkpointer.save(str(tmp_path / "plain"), values)
    sk.convert(tmp_path / "run" / "4", str(tmp_path / "step"))
    sk.convert(tmp_path / "run" / "4" / "default", str(tmp_path / "item"))
    sk.convert(tmp_path / "single", str(tmp_path / "one"))
    for out in ("step", "item"):
        info = sk.metadata(tmp_path / out)
        assert info.custom_metadata == custom and info.step == 4
        np.testing.assert_array_equal(sk.load(tmp_path / out)["w"], values["w"])
    assert sk.metadata(tmp_path / "one").custom_metadata == {"note": "x"}
    sk.convert(tmp_path / "plain", str(tmp_path / "none"))
    assert sk.metadata(tmp_path / "none").custom_metadata == {}
