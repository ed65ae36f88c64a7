"""Ctrl-C reaches Python while shardkeep waits, without waiting for what
it waits for, and an interrupted save never commits.

Each test holds the save (or the wait) until the interrupt has come out,
so an interrupt that only arrived once the wait ended fails the test
whatever the machine's load."""

import contextlib
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
from shardkeep import _core
from shardkeep.job import distributed, waiters
from shardkeep.saving import background_saves
from local_coordination import Gate, LocalCoordination

_TESTS_DIR = os.path.dirname(__file__)
_LIMIT_S = 60.0  # a bound on a stuck test only


@pytest.fixture(autouse=True)
def _sigint_is_keyboard_interrupt():
    """Each test sends itself SIGINT, which Python turns into
    KeyboardInterrupt only where its own handler is installed: a runner
    started as a shell's background job inherits SIGINT ignored, and
    Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_once_waiting(done: threading.Event, waiting_in) -> None:
    """Sends SIGINT once the main thread waits in ``waiting_in`` (its
    innermost Python frame), so that the interrupt meets the wait itself,
    not the code before it; stops looking once ``done`` is set."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + _LIMIT_S
    while not done.is_set() and time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        if frame is not None and frame.f_code is waiting_in.__code__:
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.005)


def _interrupted_while_waiting(call, waiting_in=sk.SaveFuture.result) -> None:
    """Runs call(), which waits for a save in ``waiting_in``, and interrupts its wait."""
    done = threading.Event()
    sender = threading.Thread(target=_interrupt_once_waiting, args=(done, waiting_in),
                              daemon=True)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        done.set()
        sender.join()


def _wait_until_no_background_saves(limit_s=30.0):
    deadline = time.monotonic() + limit_s
    while background_saves.running():
        assert time.monotonic() < deadline, "background saves never finished"
        time.sleep(0.01)


def _committed(path):
    return os.path.exists(os.path.join(path, "_SHARDKEEP"))


@contextlib.contextmanager
def _saves_held_at(phase, monkeypatch):
    """Holds every save at barrier ``phase`` for the body, which interrupts
    a wait for one; then checks the interrupt came while the save was held,
    lets the save go on and waits for it to wind down."""
    gate = Gate(phase, _LIMIT_S)
    LocalCoordination(gate).install(monkeypatch)
    yield
    assert not gate.gave_up  # the interrupt came while the save was held
    gate.open()
    _wait_until_no_background_saves()


def test_ctrl_c_interrupts_result_and_the_save_never_commits(ckpt, monkeypatch):
    with _saves_held_at("written", monkeypatch):
        future = sk.save_async(ckpt, {"w": np.ones(1000, np.float32)})
        _interrupted_while_waiting(future.result)
    assert not _committed(ckpt)  # the held save wound down without committing
    with pytest.raises(sk.ShardkeepError):
        future.result()


def test_ctrl_c_interrupts_a_managers_wait_and_its_save_still_commits(tmp_path, monkeypatch):
    with _saves_held_at("written", monkeypatch):
        mgr = sk.CheckpointManager(tmp_path)
        mgr.save(1, {"w": np.ones(10)})
        _interrupted_while_waiting(mgr.wait, waiting_in=sk.SaveFuture.wait_for_end)
    mgr.close()  # the save was not cancelled: it committed, and joined the record
    assert mgr.all_steps() == [1] and _committed(mgr.step_path(1))


def test_ctrl_c_interrupts_a_synchronous_save(ckpt, monkeypatch):
    with _saves_held_at("written", monkeypatch):
        _interrupted_while_waiting(lambda: sk.save(ckpt, {"w": np.ones(1000)}))
    assert not _committed(ckpt)
    sk.save(ckpt, {"w": np.ones(1000)}, force=True)  # the path is usable again
    assert _committed(ckpt)


def test_ctrl_c_in_a_barrier_of_the_blocking_phase_is_a_keyboard_interrupt(ckpt, monkeypatch):
    # The "prepared" barrier runs inside the core, while the caller waits:
    # the interrupt must come out as itself, not as an error of the
    # coordination service.
    with _saves_held_at("prepared", monkeypatch):
        _interrupted_while_waiting(lambda: sk.save(ckpt, {"w": np.ones(10)}))
    assert not _committed(ckpt)


_JAX_WAIT = textwrap.dedent("""
    import signal, sys, threading, os, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as the fixture above
    import jax
    jax.distributed.initialize(f"localhost:{sys.argv[1]}", num_processes=1, process_id=0)
    from shardkeep.job import distributed, waiters
    coordination = distributed.coordination()
    main = threading.main_thread().ident

    def get_waiting():  # the main thread waits for the waiter that runs the get
        frame = sys._current_frames().get(main)
        return (frame is not None and frame.f_code is waiters.Call.wait.__code__
                and any(t.name == waiters.THREAD_NAME for t in threading.enumerate()))

    sent = threading.Event()

    def interrupt_once_waiting():
        while not get_waiting():
            time.sleep(0.005)
        sent.set()
        os.kill(os.getpid(), signal.SIGINT)  # to the process, as Ctrl-C is

    threading.Thread(target=interrupt_once_waiting, daemon=True).start()
    try:
        coordination.get("shardkeep/never-set", 600.0)  # longer than the test waits
    except KeyboardInterrupt:
        print("interrupted while the get waited:", sent.is_set(), flush=True)
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
    assert "interrupted while the get waited: True" in out, (
        proc.returncode, out, proc.stderr.decode()[-2000:])


class _UnansweredClient:
    """A JAX client whose blocking get of a key not set waits until
    ``release()`` (its timeout is far above the test's), and says when one
    is waiting; it records the thread each blocking get ran on."""

    def __init__(self):
        self.store: dict[str, str] = {}
        self.waiting = threading.Event()
        self.get_threads: list[threading.Thread] = []
        self._released = threading.Event()

    def key_value_set(self, key, value, allow_overwrite=False):
        self.store[key] = value

    def key_value_try_get(self, key):
        if key not in self.store:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.store[key]

    def blocking_key_value_get(self, key, timeout_in_ms):
        self.get_threads.append(threading.current_thread())
        if key in self.store:
            return self.store[key]
        self.waiting.set()
        self._released.wait(_LIMIT_S)
        raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]

    def key_value_delete(self, key):
        self.store.pop(key, None)

    def release(self):
        self._released.set()


def _interrupt_once(event: threading.Event) -> None:
    """Sends SIGINT to this process once ``event`` is set."""
    def send():
        if event.wait(_LIMIT_S):
            os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=send, daemon=True).start()


def _waiter_threads() -> set:
    return {t for t in threading.enumerate() if t.name == waiters.THREAD_NAME}


def test_blocking_calls_on_the_main_thread_reuse_waiter_threads():
    client = _UnansweredClient()
    client.store["k"] = "v"
    bridge = distributed.JaxCoordination(client, 0, 2)
    assert bridge.get("k", 60.0) == "v"  # at least one waiter exists from here on
    existing = _waiter_threads()
    for _ in range(5):
        assert bridge.get("k", 60.0) == "v"
    assert threading.main_thread() not in client.get_threads  # the main thread stays free
    # No thread was started for the later calls: they ran on waiters that
    # were already there.
    assert set(client.get_threads[1:]) <= existing
    assert _waiter_threads() == existing


def test_an_interrupted_calls_waiter_serves_no_other_call_until_that_call_ends():
    client = _UnansweredClient()
    client.store["k"] = "v"
    bridge = distributed.JaxCoordination(client, 1, 2)
    _interrupt_once(client.waiting)
    try:
        with pytest.raises(KeyboardInterrupt):
            bridge.get("never-set", 600.0)
        # The abandoned get still blocks (only release() ends it), and the
        # next call runs on another waiter and returns.
        assert bridge.get("k", 60.0) == "v"
        abandoned, later = client.get_threads
        assert later is not abandoned and abandoned.is_alive()
    finally:
        client.release()


def test_ctrl_c_interrupts_an_operation_id_agreement():
    # The agreement runs in the core, which waits for the verdict through
    # the bridge's get: the interrupt comes out of agree as itself.
    client = _UnansweredClient()
    bridge = distributed.JaxCoordination(client, 1, 2)  # process 1 waits for process 0
    operation_ids = _core.OperationIds(distributed.core_coordinator(bridge))
    _interrupt_once(client.waiting)
    try:
        with pytest.raises(KeyboardInterrupt):
            operation_ids.agree("save", "/ckpt/7", 600.0)
    finally:
        client.release()  # ends the abandoned get
    assert client.waiting.is_set()


def test_ctrl_c_while_the_start_is_queued_means_it_never_starts(ckpt):
    release = threading.Event()
    released = []

    def slow_start():  # a save ahead in the starter's queue
        released.append(release.wait(_LIMIT_S))
        raise sk.ShardkeepError("the slow start")

    background_saves.start(slow_start, "slow", 60.0)
    future = sk.save_async(ckpt, {"w": np.ones(10)})
    _interrupted_while_waiting(future.result)
    assert released == []  # the interrupt came while the start ahead still ran
    release.set()
    _wait_until_no_background_saves()
    assert not os.path.exists(ckpt) and not os.path.exists(ckpt + ".shardkeep-tmp")
    with pytest.raises(sk.ShardkeepError, match="cancelled before it started"):
        future.result()
