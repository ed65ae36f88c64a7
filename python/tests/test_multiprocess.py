"""Real multi-process JAX jobs on localhost (jax.distributed.initialize).

Each job starts fresh Python processes (see multiprocess/harness.py), so
these tests are slow by nature; they keep states small and reuse one saved
checkpoint for several loads.
"""

import json
import pathlib
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from index_reader import read_index

sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
import harness  # noqa: E402
import scenarios  # noqa: E402

import shardkeep as sk  # noqa: E402
from shardkeep import _core  # noqa: E402
from shardkeep.job import distributed  # noqa: E402

ARRAY_LEAVES = list(scenarios.ARRAYS) + ["numpy"]


@pytest.fixture(scope="module", params=[True, False],
                ids=["replica_parallel", "replica_id_0"])
def saved(request, tmp_path_factory):
    """A checkpoint saved by 4 processes x 2 devices (async when replica-parallel)."""
    path = tmp_path_factory.mktemp("mp") / "ckpt"
    results = harness.run_job(4, 2, "save_state",
                              {"path": str(path), "replica_parallel": request.param,
                               "use_async": request.param})
    assert [r["process"] for r in results] == [0, 1, 2, 3]
    assert all(r["committed"] for r in results)
    return request.param, path


def _shape_and_itemsize(name):
    if name == "numpy":
        return scenarios.NUMPY_SHAPE, 8
    shape, dtype, _ = scenarios.ARRAYS[name]
    return shape, jnp.dtype(dtype).itemsize


def test_every_byte_is_written_once(saved):
    replica_parallel, path = saved
    state = path / "state"
    meta = json.loads((state / "meta.json").read_text())
    number = {leaf["path"]: i for i, leaf in enumerate(meta["leaves"])}
    files = sorted((state / "index").iterdir())
    assert [f.name for f in files] == [f"p{p}.idx" for p in range(4)]
    writers = {name: set() for name in ARRAY_LEAVES}
    cover = {name: np.zeros(_shape_and_itemsize(name)[0], np.int32) for name in ARRAY_LEAVES}
    total = 0
    for process, f in enumerate(files):
        for r in read_index(f.read_bytes()):
            name = meta["leaves"][r["leaf"]]["path"]
            shape, itemsize = _shape_and_itemsize(name)
            assert r["raw_length"] == int(np.prod(r["shape"])) * itemsize, (name, r)
            assert r["raw_length"] > 0, (name, r)
            cover[name][tuple(slice(o, o + n) for o, n in zip(r["origin"], r["shape"]))] += 1
            writers[name].add(process)
            total += r["raw_length"]
    assert total == sum(int(np.prod(_shape_and_itemsize(n)[0])) * _shape_and_itemsize(n)[1]
                        for n in ARRAY_LEAVES)
    for name in ARRAY_LEAVES:
        assert name in number
        assert (cover[name] == 1).all(), f"{name}: elements not stored exactly once"
    assert writers["numpy"] == {0}
    assert writers["sharded"] == {0, 1, 2, 3}
    assert writers["rows"] == {0, 1, 2, 3}  # each process holds its own rows
    if replica_parallel:
        # Boxes replicated across processes are shared out among them.
        assert writers["replicated"] == {0, 1, 2, 3}
        assert writers["cols"] == {0, 1, 2, 3}
        assert len(writers["tiny"]) > 1  # 3 elements, 8 replicas: 3 devices write
    else:
        assert len(writers["replicated"]) == 1
        assert len(writers["cols"]) == 1


@pytest.mark.parametrize("topology", [
    dict(processes=2, devices=4, args={"mesh_shape": [2, 4]}),
    dict(processes=1, devices=8, args={"mesh_shape": [1, 8], "untargeted": True}),
    dict(processes=4, devices=2, args={"transpose": True}),
], ids=["2x4", "1x8", "4x2_transposed"])
def test_load_on_another_topology(saved, topology):
    _, path = saved
    results = harness.run_job(topology["processes"], topology["devices"], "load_state",
                              {"path": str(path), **topology["args"]})
    # 6 jax.Array leaves, one check per local device.
    assert [r["checked"] for r in results] == [6 * topology["devices"]] * topology["processes"]
    assert all(r["global"] for r in results)


def test_checkpointables_and_partial_load(tmp_path):
    results = harness.run_job(2, 2, "checkpointables", {"path": str(tmp_path / "ckpt")})
    for r in results:
        assert r["step"] == 3
        assert r["checkpointables"] == ["blob", "config", "state"]
        assert r["checked"] == 2 + 3 * 2  # partial: 1 leaf; whole: 3 leaves, 2 devices


def test_dead_process_fails_the_save_everywhere_and_commits_nothing(tmp_path):
    path = tmp_path / "ckpt"
    timeout_s = 10.0
    results = harness.run_job(4, 2, "save_with_dead_peer",
                              {"path": str(path), "victim": 2, "timeout_s": timeout_s},
                              expect_killed=(2,), heartbeat_timeout_s=60)
    assert results[2] is None
    for process in (0, 1, 3):
        r = results[process]
        assert r["error"] == "TimeoutError", r
        assert "did not arrive" in r["message"] and "[2]" in r["message"], r
        assert "/written" in r["message"], r
        assert r["elapsed_s"] < timeout_s + 10, r
        assert not r["committed"], r
    assert not (path / "_SHARDKEEP").exists()
    # A fresh job saves to the same path (the stale temporary folder is
    # replaced) and loads what it saved.
    results = harness.run_job(4, 2, "save_state", {"path": str(path), "verify": True})
    assert all(r["committed"] and r["checked"] == 12 for r in results)
    assert (path / "_SHARDKEEP").exists()


def test_python_keeps_running_while_a_save_waits_at_a_barrier(tmp_path):
    # The core calls the barrier from its background thread; JAX's client
    # must not hold the GIL while it waits.
    results = harness.run_job(2, 1, "python_runs_while_save_waits",
                              {"path": str(tmp_path / "ckpt"), "delay_s": 2.0})
    r = results[0]
    assert r["waited_s"] > 1.5, r
    assert r["rate"] > 0.2 * r["baseline"], r


class _FakeClient:
    """Stands in for JAX's runtime client; raises what it is told to."""

    def __init__(self, barrier_error=None, arrived=(), error=None):
        self.barrier_error, self.arrived, self.error = barrier_error, arrived, error
        self.store = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.error:
            raise self.error
        if key in self.store and not allow_overwrite:
            raise RuntimeError(f"ALREADY_EXISTS: Config key {key} already exists.")
        self.store[key] = value

    def wait_at_barrier(self, key, timeout_in_ms, process_ids=None):
        if self.barrier_error:
            raise self.barrier_error

    def key_value_dir_get(self, prefix):
        return [(f"{prefix}{p}", "1") for p in self.arrived]

    def key_value_delete(self, key):
        self.store.pop(key, None)

    def key_value_try_get(self, key):
        if key not in self.store:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.store[key]

    def blocking_key_value_get(self, key, timeout_in_ms):
        if key not in self.store:
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.store[key]


class _SharedStore:
    """JAX's key-value store as several processes' clients see it."""

    def __init__(self):
        self.store = {}
        self.changed = threading.Condition()

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.changed:
            if key in self.store and not allow_overwrite:
                raise RuntimeError(f"ALREADY_EXISTS: Config key {key} already exists.")
            self.store[key] = value
            self.changed.notify_all()

    def key_value_try_get(self, key):
        with self.changed:
            if key not in self.store:
                raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
            return self.store[key]

    def blocking_key_value_get(self, key, timeout_in_ms):
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.store, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
            return self.store[key]

    def key_value_dir_get(self, prefix):
        with self.changed:
            return [(k, v) for k, v in self.store.items() if k.startswith(prefix)]

    def key_value_delete(self, key):
        with self.changed:
            self.store.pop(key, None)


def test_agreed_operations_leave_no_keys_behind():
    """A long job makes an agreed operation per save: once every process has
    read an operation's "go", its verdict and arrivals are deleted, so the
    coordination service does not grow by a key per operation. (The
    agreement is the core's; this runs it through the bridge to JAX's
    client, with each simulated process's own record of verdicts.)"""
    store, processes, operations = _SharedStore(), 3, 20
    ids = [[] for _ in range(processes)]

    def run(p):
        bridge = distributed.JaxCoordination(store, p, processes)
        agreement = _core.OperationIds(distributed.core_coordinator(bridge))
        for i in range(operations):
            ids[p].append(agreement.agree("save", f"/ckpt/{i % 4}", 30.0))

    threads = [threading.Thread(target=run, args=(p,)) for p in range(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert ids[0] == ids[1] == ids[2] and len(set(ids[0])) == operations
    assert store.store == {}


def test_barrier_timeout_names_the_missing_processes():
    client = _FakeClient(RuntimeError("DEADLINE_EXCEEDED: Barrier timed out. Id: b"),
                         arrived=(0, 1, 3))
    bridge = distributed.JaxCoordination(client, 0, 5)
    with pytest.raises(sk.TimeoutError, match=r"barrier 'b' timed out after 2\.5 s; "
                       r"processes \[2, 4\] did not arrive"):
        bridge.barrier("b", 2.5)
    assert client.store == {"b/arrived/0": "1"}


def test_other_service_errors_become_shardkeep_errors():
    client = _FakeClient(RuntimeError("INTERNAL: Barrier failed because: task is set to"
                                      " ERROR: UNAVAILABLE: Task 2 heartbeat timeout"),
                         arrived=(0, 1))
    bridge = distributed.JaxCoordination(client, 0, 3)
    with pytest.raises(sk.ShardkeepError, match=r"processes \[2\] did not arrive.*heartbeat") as e:
        bridge.barrier("b", 1.0)
    assert not isinstance(e.value, sk.TimeoutError)
    # A barrier that passes leaves no arrival record behind.
    ok = _FakeClient()
    distributed.JaxCoordination(ok, 1, 2).barrier("b", 1.0)
    assert ok.store == {}
    # Key-value operations.
    bridge = distributed.JaxCoordination(ok, 1, 2)
    assert bridge.try_get("k") is None
    bridge.set("k", "v")
    assert bridge.try_get("k") == "v" and bridge.get("k", 1.0) == "v"
    # Keys are write-once: the commit protocol's outcome key depends on it.
    with pytest.raises(sk.AlreadyExistsError, match="'k' is already set"):
        bridge.set("k", "w")
    with pytest.raises(sk.TimeoutError, match="'missing' did not appear"):
        bridge.get("missing", 0.5)
    broken = distributed.JaxCoordination(_FakeClient(error=RuntimeError("UNAVAILABLE: gone")),
                                          1, 2)
    with pytest.raises(sk.ShardkeepError, match="setting key 'k'.*UNAVAILABLE"):
        broken.set("k", "v")


def test_single_process_jobs_need_no_coordinator():
    assert distributed.coordinator() is None


def test_missing_runtime_client_is_a_clear_error(monkeypatch):
    from jax._src.distributed import global_state

    monkeypatch.setattr(global_state, "client", None)
    with pytest.raises(sk.ShardkeepError, match="jax.distributed.initialize"):
        distributed.coordination()
    monkeypatch.setattr(global_state, "client", object())
    with pytest.raises(sk.ShardkeepError, match="lacks .*wait_at_barrier"):
        distributed.coordination()


def test_a_save_failing_on_one_process_keeps_later_saves_in_step(tmp_path):
    results = harness.run_job(2, 1, "save_after_one_process_failed",
                              {"path": str(tmp_path / "ckpt"), "timeout_s": 3.0})
    assert results[1]["first_error"] == "InvalidArgumentError"
    assert results[0]["first_error"] == "TimeoutError"
    assert all(r["second_ok"] for r in results)


def test_a_lone_call_fails_naming_the_others_and_the_job_goes_on(tmp_path):
    """Operation ids are agreed, not counted: a save or an exchange that one
    process makes alone fails within its timeout_s, naming the processes
    that did not join; every later collective call of the job works (a
    save of the lone save's path included)."""
    root = tmp_path / "root"
    results = harness.run_job(2, 2, "agreement_scenarios:lone_calls", {"path": str(root)},
                              timeout=180)
    lone_save, lone_exchange = results[0]["lone_save"], results[1]["lone_exchange"]
    assert (f"save of {str(root / 'lone')!r}: processes [1] did not join it within 3 s"
            f" (processes [0] did)") in lone_save["error"]
    assert "exchange of 'lone': processes [0] did not join it" in lone_exchange["error"]
    for lone in (lone_save, lone_exchange):
        assert lone["seconds"] < 3.0 + 5.0, lone
    for r in results:
        assert r["after"] and r["again"] and r["broadcast"], r
        assert r["steps"] == [1, 2] and r["restored"] == [2, True], r


def test_processes_saving_different_trees_fail_naming_them(tmp_path):
    results = harness.run_job(3, 1, "save_disagreeing_trees",
                              {"path": str(tmp_path / "ckpt")})
    for r in results:
        assert r["first_error"] == "InvalidArgumentError", r
        assert ("process 1 differs from process 0 in the meta.json of 'state'"
                in r["message"]), r
        assert r["left"] == ["ckpt"], r  # nothing of the failed save
        assert r["second_ok"], r


def test_typed_prng_keys_across_processes(tmp_path):
    results = harness.run_job(2, 2, "typed_keys", {"path": str(tmp_path / "ckpt")})
    # 6 key leaves, loaded twice (targeted, untargeted), 2 local devices each.
    assert [r["checked"] for r in results] == [6 * 2 * 2] * 2
