"""Saves in flight hold leases that every collector honours (docs/FORMAT.md,
"Leases").

A root is often shared: an evaluation job opens a manager on it, a
restarted job opens one while the old one is still saving, an operator runs
`shardkeep gc`. Each of them collects leftovers, and a save in flight looks
exactly like one until it commits. Here the first save is held at its
"written" barrier (its data written, its commit not made) while another
process collects, on a file system, on S3 and on GCS; then the save commits and
loads bit for bit. A killed job's lease expires with its process, and its
leftovers are then collected.
"""

import os
import pathlib
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import shardkeep as sk
from shardkeep import _core
from local_coordination import LocalCoordination
from test_cli import kill_a_save, run

_TESTS_DIR = pathlib.Path(__file__).parent

_OPEN_A_MANAGER = textwrap.dedent("""
    import sys
    import shardkeep as sk
    with sk.CheckpointManager(sys.argv[1]) as mgr:
        print("steps", mgr.all_steps())
""")


def _in_another_process(script: str, *args: str) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=_TESTS_DIR,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _state():
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((256, 1024)).astype(np.float32),
            "b": rng.integers(0, 1 << 30, size=(4096,), dtype=np.int64)}


def _held_at_written(monkeypatch):
    """Installs a coordination whose "written" barrier waits for the event
    returned second; the first event is set once a save has reached it."""
    reached, release = threading.Event(), threading.Event()

    def hook(key: str) -> None:
        if key.endswith("/written"):
            reached.set()
            assert release.wait(120), "the test never released the save"

    LocalCoordination(hook).install(monkeypatch)
    return reached, release


@pytest.fixture(params=["file", "s3", "gs"])
def root(request, tmp_path):
    if request.param == "file":
        return str(tmp_path / "run")
    return request.getfixturevalue({"s3": "s3", "gs": "gcs"}[request.param]).url("run")


@pytest.mark.parametrize("collector", ["manager", "gc"])
def test_a_save_in_flight_survives_another_process_collecting(root, collector, monkeypatch):
    reached, release = _held_at_written(monkeypatch)
    state = _state()
    mgr = sk.CheckpointManager(root)
    try:
        mgr.save(1, state)
        assert reached.wait(120)
        if collector == "manager":
            assert "steps []" in _in_another_process(_OPEN_A_MANAGER, root)
        else:
            out = run("gc", root).stdout
            assert "kept" in out and "a save in flight holds the lease" in out, out
            assert "removed 0 leftovers" in out, out
        release.set()
        mgr.wait()
    finally:
        release.set()
        mgr.close()
    loaded = sk.load(f"{root}/000000001")
    for name, value in state.items():
        assert loaded[name].dtype == value.dtype
        assert loaded[name].tobytes() == value.tobytes()
    # The lease went with the commit.
    assert "removed 0 leftovers" in run("gc", root).stdout


def test_a_killed_jobs_lease_expires_with_it_and_its_leftovers_are_collected(root):
    kill_a_save(root, 2)
    listed = {e.name: e.state for e in _core.list_checkpoints(root, sk.Options().to_core())}
    leftover = {_core.EntryState.TEMPORARY, _core.EntryState.UNFINISHED}
    assert set(listed.values()) <= leftover and listed, listed
    # Its process is gone, so its lease no longer protects the folder: the
    # next manager to open the root removes it.
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == []
    assert _core.list_checkpoints(root, sk.Options().to_core()) == []


def test_a_save_whose_folder_was_removed_fails_with_lease_lost(tmp_path, monkeypatch):
    """What a user sees when a collector that ignores leases (an older
    version's `gc`, `rm -rf`) removes a save's folder while it is written."""
    reached, release = _held_at_written(monkeypatch)
    path = tmp_path / "ckpt"
    future = sk.save_async(str(path), _state())
    assert reached.wait(120)
    temporary = tmp_path / "ckpt.shardkeep-tmp"
    assert any(p.name.startswith(".shardkeep-lease-") for p in temporary.iterdir())
    os.rename(temporary, tmp_path / "elsewhere")
    release.set()
    with pytest.raises(sk.LeaseLostError, match="lease of .*ckpt.shardkeep-tmp was removed"):
        future.result()
    assert not path.exists()
