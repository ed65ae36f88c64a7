"""Preemption: SIGTERM makes the manager save the current step and report it."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np

import shardkeep as sk
from shardkeep.manager.preemption import PreemptionWatch

CHILD = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import shardkeep as sk

    calls = []
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    mine = signal.getsignal(signal.SIGTERM)
    with sk.CheckpointManager(sys.argv[1], save_interval_steps=1000) as mgr:
        print("source", mgr._preemption.source, flush=True)
        for step in range(1, 10000):
            saved = mgr.save(step, {"w": np.full((4,), step, np.float32)})
            print("step", step, "saved" if saved else "", flush=True)
            if mgr.reached_preemption(step):
                print("preempted", step, flush=True)
                break
            time.sleep(0.01)
    print("chained", calls, flush=True)
    print("restored", signal.getsignal(signal.SIGTERM) is mine, flush=True)
""")


def test_sigterm_saves_the_current_step_in_a_child_process(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in child.stdout:
            lines.append(line.split())
            if lines[-1] == ["step", "5"]:
                child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert ["source", "sigterm"] in lines
    preempted = next(int(words[1]) for words in lines if words[0] == "preempted")
    assert 5 <= preempted < 1000
    assert ["step", str(preempted), "saved"] in lines  # saved although not due
    assert ["chained", f"[{int(signal.SIGTERM)}]"] in lines
    assert ["restored", "True"] in lines
    with sk.CheckpointManager(tmp_path) as mgr:
        assert mgr.all_steps() == [preempted]
        np.testing.assert_array_equal(mgr.load()["w"], np.full((4,), preempted, np.float32))


def test_sigterm_in_process_is_latched_and_chained(tmp_path):
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with sk.CheckpointManager(tmp_path, save_interval_steps=100) as mgr:
            assert not mgr.reached_preemption(1)
            assert mgr.save(1, {"w": np.zeros(2)}) is False
            os.kill(os.getpid(), signal.SIGTERM)
            assert mgr.save(2, {"w": np.zeros(2)}) is True
            assert mgr.reached_preemption(2) and mgr.reached_preemption(3)
            assert calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, old)


def test_no_handler_outside_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    watch = []
    thread = threading.Thread(target=lambda: watch.append(PreemptionWatch()))
    thread.start()
    thread.join(30)
    assert watch[0].source == "none"
    assert not watch[0].reached(1)
    watch[0].close()
    assert signal.getsignal(signal.SIGTERM) is before
