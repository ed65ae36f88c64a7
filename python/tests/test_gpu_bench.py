"""bench/gpu.py, the accelerator benchmark, runs unchanged on CPU devices:
at the tiny scale every measurement is taken, every tool's data checks
out, the targets are computed, and bench/report_gpu.py renders them. The
device machine's lease is short; this is where the script is proven."""

import json
import os
import subprocess
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")


def _run_bench(folder, budget_s: float, *flags: str) -> dict:
    """bench/gpu.py at tiny scale on one CPU device (as the accelerator
    machine has one GPU); its results."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    done = subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu.py"), "--scale", "tiny",
         "--out", str(folder / "gpu.json"), "--root", str(folder / "root"),
         "--budget-s", str(budget_s), *flags],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((folder / "gpu.json").read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu-bench")
    return folder, _run_bench(folder, 900, "--trace")


def test_every_measurement_is_taken_and_checked(run):
    folder, results = run
    assert results["errors"] == {}
    assert results["skipped"] == []
    assert results["environment"]["devices"] == 1
    floors = results["floors"]
    for name in ("d2h_pinned", "d2h_pageable"):
        assert floors["jax"][name]["seconds"] > 0
    assert set(floors["jax"]["h2d"]) == {"pageable", "pinned"}
    # shardkeep's pinned staging takes numpy views of pinned arrays.
    assert floors["jax"]["pinned_numpy_is_a_view"] is True
    for name in ("write", "read_warm", "read_cold"):
        assert floors["disk"][name]["seconds"] > 0
    assert set(results["stall"]) == {"shardkeep", "orbax-tuned", "dcp-tuned",
                                     "shardkeep-pageable"}
    for name, stall in results["stall"].items():
        assert stall["verified"] is True, name
        assert len(stall["saves"]) == results["config"]["stall_saves"]
    state_bytes = results["config"]["state_bytes"]
    for tool in ("shardkeep", "orbax-tuned", "dcp-tuned", "safetensors"):
        assert results["save"][tool]["bytes_on_disk"] >= state_bytes, tool
        for load in ("load_warm", "load_cold"):
            assert results[load][tool]["verified"] is True, (load, tool)
    assert results["profile"]["blocking_seconds"] > 0
    assert any("save_async" in line for line in results["profile"]["cprofile_top"])
    # JAX's trace of one save, packed as one file beside the results.
    assert results["profile"]["trace"] == "trace.tar.gz"
    with tarfile.open(folder / "trace.tar.gz") as tar:
        assert any(name.endswith(".xplane.pb") for name in tar.getnames())
    assert all(value is not None for value in results["targets"].values())


def test_the_report_renders_every_table(run):
    folder, _ = run
    done = subprocess.run([sys.executable, os.path.join(BENCH, "report_gpu.py"), str(folder)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = (folder / "RESULTS.md").read_text()
    for heading in ("## Targets", "## Floors", "## Training stall", "## Durable save"):
        assert heading in text
    for tool in ("shardkeep", "orbax-tuned", "dcp-tuned", "safetensors"):
        assert f"| {tool} |" in text
    assert "WRONG DATA" not in text and "failed" not in text


def test_a_short_lease_skips_steps_and_still_leaves_results(tmp_path):
    """With almost no time left every step that needs some is skipped and
    listed; the JSON and its report are whole."""
    results = _run_bench(tmp_path, 0.5)
    skipped = " ".join(results["skipped"])
    for step in ("stall/shardkeep", "stall/orbax-tuned", "stall/dcp-tuned", "save/shardkeep",
                 "save/safetensors", "profile"):
        assert step in skipped, step
    assert "stall" not in results and "save" not in results
    assert results["targets"]["stall_over_best_peer"] is None
    subprocess.run([sys.executable, os.path.join(BENCH, "report_gpu.py"), str(tmp_path)],
                   check=True, timeout=60)
    assert "## Skipped for time" in (tmp_path / "RESULTS.md").read_text()
