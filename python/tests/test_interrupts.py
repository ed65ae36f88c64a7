"""Ctrl-C reaches Python within half a second while shardkeep waits, and an
interrupted save never commits."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shardkeep as sk
from shardkeep.saving import background_saves
from local_coordination import LocalCoordination, stall_at

_TESTS_DIR = os.path.dirname(__file__)
_PROMPT_S = 0.5


def _sigint_after(seconds):
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def _interrupted_after(call, delay_s=0.3):
    """Runs call() with SIGINT sent after delay_s; returns how long after the
    signal KeyboardInterrupt arrived."""
    timer = _sigint_after(delay_s)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.join()
    return time.monotonic() - start - delay_s


def _wait_until_no_background_saves(limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while background_saves.running():
        assert time.monotonic() < deadline, "background saves never finished"
        time.sleep(0.01)


def _committed(path):
    return os.path.exists(os.path.join(path, "_SHARDKEEP"))


def test_ctrl_c_interrupts_result_and_the_save_never_commits(ckpt, monkeypatch):
    LocalCoordination(stall_at("written", 2.0)).install(monkeypatch)
    future = sk.save_async(ckpt, {"w": np.ones(1000, np.float32)})
    assert _interrupted_after(future.result) < _PROMPT_S
    _wait_until_no_background_saves()  # the stalled save winds down...
    assert not _committed(ckpt)  # ...without committing
    with pytest.raises(sk.ShardkeepError):
        future.result()


def test_ctrl_c_interrupts_a_synchronous_save(ckpt, monkeypatch):
    LocalCoordination(stall_at("written", 2.0)).install(monkeypatch)
    assert _interrupted_after(lambda: sk.save(ckpt, {"w": np.ones(1000)})) < _PROMPT_S
    _wait_until_no_background_saves()
    assert not _committed(ckpt)
    sk.save(ckpt, {"w": np.ones(1000)}, force=True)  # the path is usable again
    assert _committed(ckpt)


def test_ctrl_c_in_a_barrier_of_the_blocking_phase_is_a_keyboard_interrupt(ckpt, monkeypatch):
    # The "prepared" barrier runs inside the core, while the caller waits:
    # the interrupt must come out as itself, not as an error of the
    # coordination service.
    LocalCoordination(stall_at("prepared", 5.0)).install(monkeypatch)
    assert _interrupted_after(lambda: sk.save(ckpt, {"w": np.ones(10)})) < _PROMPT_S
    assert not _committed(ckpt)


_JAX_WAIT = textwrap.dedent("""
    import signal, sys, threading, os, time
    import jax
    jax.distributed.initialize(f"localhost:{sys.argv[1]}", num_processes=1, process_id=0)
    from shardkeep.job import distributed
    coordination = distributed.coordination()
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        coordination.get("shardkeep/never-set", 30.0)
    except KeyboardInterrupt:
        print("interrupted after", time.monotonic() - start - 0.5, flush=True)
    os._exit(0)  # skip JAX's shutdown barrier
""")


def test_ctrl_c_interrupts_a_wait_in_jax_coordination_service():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _JAX_WAIT, str(port)], env=env,
                          cwd=_TESTS_DIR, capture_output=True, timeout=120)
    out = proc.stdout.decode()
    assert "interrupted after" in out, (proc.returncode, out, proc.stderr.decode()[-2000:])
    assert float(out.split()[-1]) < _PROMPT_S


def test_ctrl_c_while_the_start_is_queued_means_it_never_starts(ckpt):
    release = threading.Event()

    def slow_start():  # a save ahead in the starter's queue
        release.wait(30)
        raise sk.ShardkeepError("the slow start")

    background_saves.start(slow_start, "slow", 60.0)
    future = sk.save_async(ckpt, {"w": np.ones(10)})
    assert _interrupted_after(future.result) < _PROMPT_S
    release.set()
    _wait_until_no_background_saves()
    assert not os.path.exists(ckpt) and not os.path.exists(ckpt + ".shardkeep-tmp")
    with pytest.raises(sk.ShardkeepError, match="cancelled before it started"):
        future.result()
