"""A dropped SaveFuture does not make save_async wait: the save finishes in
the background, a failure is logged, and interpreter exit waits for it."""

import json
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
from local_coordination import Gate, LocalCoordination, stall_at

_TESTS_DIR = os.path.dirname(__file__)


def _wait_until_no_background_saves(limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while background_saves.running():
        assert time.monotonic() < deadline, "background saves never finished"
        time.sleep(0.01)


def test_bare_save_async_returns_while_a_slow_save_goes_on(ckpt, monkeypatch):
    gate = Gate("written", limit_s=60.0)
    LocalCoordination(gate).install(monkeypatch)
    tree = {"w": np.arange(1000, dtype=np.float32)}
    sk.save_async(ckpt, tree)  # the future is dropped at once
    # Returned while the save is held: it did not wait for the background phase.
    assert not gate.gave_up
    assert not os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))
    gate.open()
    _wait_until_no_background_saves()
    assert not gate.gave_up
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


def test_wait_for_end_neither_raises_nor_collects_the_failure(ckpt, monkeypatch, caplog):
    def fail():
        raise RuntimeError("boom")
    LocalCoordination(stall_at("written", 0.0, then=fail)).install(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="shardkeep"):
        future = sk.save_async(ckpt, {"w": np.ones(10)})
        assert future.wait_for_end()  # ended: no error raised here
        assert future.done()
        _wait_until_no_background_saves()
    # Nobody collected it: the queue logs it, and result() still raises it.
    (record,) = [r for r in caplog.records if r.name == "shardkeep"]
    assert ckpt in record.getMessage() and "boom" in record.getMessage()
    with pytest.raises(sk.ShardkeepError, match="boom"):
        future.result()


def test_a_failure_on_finished_reports_is_not_logged_by_the_queue(ckpt, monkeypatch, caplog):
    from shardkeep.saving import save as save_lib

    def fail():
        raise RuntimeError("boom")
    LocalCoordination(stall_at("written", 0.0, then=fail)).install(monkeypatch)
    ends = []
    with caplog.at_level(logging.ERROR, logger="shardkeep"):
        future = save_lib.start_save(ckpt, {"state": {"w": np.ones(10)}}, asynchronous=True,
                                     on_finished=lambda *end: ends.append(end) or True)
        assert future.wait_for_end()
        _wait_until_no_background_saves()
    assert len(ends) == 1 and "boom" in ends[0][0] and ends[0][1] is None
    assert not [r for r in caplog.records if r.name == "shardkeep"]


def test_on_finished_gets_the_commit_records_created_ns(ckpt):
    from shardkeep.saving import save as save_lib
    ends = []
    save_lib.start_save(ckpt, {"state": {"w": np.ones(10)}}, asynchronous=True,
                        on_finished=lambda *end: ends.append(end)).result()
    with open(os.path.join(ckpt, "_SHARDKEEP")) as f:
        assert ends == [(None, json.load(f)["created_ns"])]


# A script that exits right after save_async, its save held at "written"
# until the interpreter's exit has begun: an atexit hook registered after
# shardkeep's runs before it (atexit runs them in reverse), reports whether
# the save is still held and uncommitted, and opens the gate if asked to.
_EXIT_RIGHT_AFTER = textwrap.dedent("""
    import atexit, os, sys
    import numpy as np
    import shardkeep as sk
    from local_coordination import Gate, LocalCoordination
    path, timeout_s, open_at_exit = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "open"
    gate = Gate("written", limit_s=300.0)
    LocalCoordination(gate).install()
    sk.save_async(path, {"w": np.arange(1 << 16, dtype=np.int64)},
                  options=sk.Options(timeout_s=timeout_s))

    def at_exit():
        gate.wait_reached()
        held = not gate.gave_up and not os.path.exists(os.path.join(path, "_SHARDKEEP"))
        print("held at exit:", held, flush=True)
        if open_at_exit:
            gate.open()
    atexit.register(at_exit)
""")


def _run_exiting_script(ckpt, timeout_s, open_at_exit):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _EXIT_RIGHT_AFTER, ckpt, str(timeout_s),
                           "open" if open_at_exit else "keep"], env=env, cwd=_TESTS_DIR,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode()[-2000:])
    assert "held at exit: True" in proc.stdout.decode(), proc.stdout.decode()
    return proc.stderr.decode()


def test_exit_right_after_a_bare_save_async_waits_for_the_commit(ckpt):
    _run_exiting_script(ckpt, timeout_s=60, open_at_exit=True)
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
    # The save stays held for longer than the script may run (120 s): it
    # ends only because its exit stops waiting after the save's timeout_s.
    stderr = _run_exiting_script(ckpt, timeout_s=1.0, open_at_exit=False)
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
