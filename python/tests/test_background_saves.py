"""A dropped SaveFuture does not make save_async wait: the save finishes in
the background, a failure is logged, and interpreter exit waits for it."""

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shardkeep as sk
from shardkeep.saving import background_saves
from local_coordination import LocalCoordination, stall_at

_TESTS_DIR = os.path.dirname(__file__)


def _wait_until_no_background_saves(limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while background_saves.running():
        assert time.monotonic() < deadline, "background saves never finished"
        time.sleep(0.01)


def test_bare_save_async_returns_while_a_slow_save_goes_on(ckpt, monkeypatch):
    LocalCoordination(stall_at("written", 1.5)).install(monkeypatch)
    tree = {"w": np.arange(1000, dtype=np.float32)}
    start = time.monotonic()
    sk.save_async(ckpt, tree)  # the future is dropped at once
    # Before the stall ends: it did not wait for the save's background phase.
    assert time.monotonic() - start < 1.5
    assert not os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))
    _wait_until_no_background_saves()
    assert os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))
    np.testing.assert_array_equal(sk.load(ckpt)["w"], tree["w"])


def test_failure_of_a_dropped_save_is_logged_naming_the_path(ckpt, monkeypatch, caplog):
    def fail():
        raise RuntimeError("coordination service unavailable")
    LocalCoordination(stall_at("written", 0.2, then=fail)).install(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="shardkeep"):
        sk.save_async(ckpt, {"w": np.ones(10)})
        _wait_until_no_background_saves()
    (record,) = [r for r in caplog.records if r.name == "shardkeep"]
    assert ckpt in record.getMessage()
    assert "coordination service unavailable" in record.getMessage()
    assert not os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))


def test_a_failure_reported_by_result_is_not_logged_again(ckpt, monkeypatch, caplog):
    def fail():
        raise RuntimeError("boom")
    LocalCoordination(stall_at("written", 0.0, then=fail)).install(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="shardkeep"):
        future = sk.save_async(ckpt, {"w": np.ones(10)})
        try:
            future.result()
        except sk.ShardkeepError as e:
            assert "boom" in str(e)
        else:
            raise AssertionError("the save should have failed")
        _wait_until_no_background_saves()
    assert not [r for r in caplog.records if r.name == "shardkeep"]


_EXIT_RIGHT_AFTER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import shardkeep as sk
    from local_coordination import LocalCoordination, stall_at
    path, stall_s, timeout_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    LocalCoordination(stall_at("written", stall_s)).install()
    start = time.monotonic()
    sk.save_async(path, {"w": np.arange(1 << 16, dtype=np.int64)},
                  options=sk.Options(timeout_s=timeout_s))
    print("returned after", time.monotonic() - start, flush=True)
""")


def _run_exiting_script(ckpt, stall_s, timeout_s):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _EXIT_RIGHT_AFTER, ckpt, str(stall_s),
                           str(timeout_s)], env=env, cwd=_TESTS_DIR, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode()[-2000:])
    returned_after = float(proc.stdout.decode().split()[-1])
    return returned_after, time.monotonic() - start, proc.stderr.decode()


def test_exit_right_after_a_bare_save_async_waits_for_the_commit(ckpt):
    returned_after, _, _ = _run_exiting_script(ckpt, stall_s=1.0, timeout_s=60)
    assert returned_after < 1.0  # before the stall ended
    assert os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))
    np.testing.assert_array_equal(sk.load(ckpt)["w"], np.arange(1 << 16, dtype=np.int64))


def test_a_script_that_saved_exits_without_a_leak_report(ckpt):
    # Imported inside a function, shardkeep's module outlives nanobind's
    # leak check at exit: a queue object still held then was reported as
    # leaked (three screens of "nanobind: leaked ...") after every run.
    script = textwrap.dedent("""
        import sys
        def main():
            import numpy as np
            import shardkeep as sk
            sk.save_async(sys.argv[1], {"w": np.ones(10)}).result()
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", script, ckpt], capture_output=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stderr.decode() == ""


def test_exit_waits_no_longer_than_the_saves_timeout(ckpt):
    _, elapsed, stderr = _run_exiting_script(ckpt, stall_s=30.0, timeout_s=1.0)
    assert elapsed < 20
    assert "did not finish within 1 s at interpreter exit; abandoning it" in stderr
    assert ckpt in stderr
    assert not os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))


def test_a_coordinator_callback_of_the_wrong_type_fails_the_save(ckpt, monkeypatch):
    # The core calls the coordinator's Python functions from the save's
    # thread; a result it cannot convert (an int, not a str) used to escape
    # as a C++ exception there and abort the whole process.
    class WrongType(LocalCoordination):
        def try_get(self, key):
            return 42 if key.endswith("/written/failed") else super().try_get(key)
    WrongType().install(monkeypatch)
    with pytest.raises(sk.ShardkeepError) as info:
        sk.save(ckpt, {"w": np.ones(10)})
    assert f"background phase of the save of {ckpt}" in str(info.value)
    assert not os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))
