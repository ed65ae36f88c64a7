"""Saves and loads are reported through jax.monitoring under Orbax's event names."""

import threading

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

import shardkeep as sk


class Recorded:
    """Every jax.monitoring event, duration and scalar while it is installed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple[str, dict]] = []
        self.durations: dict[str, list[float]] = {}
        self.scalars: dict[str, list[float]] = {}
        self.kinds: set[tuple[str, str, tuple]] = set()  # (name, kind, keyword names)

    def on_event(self, name, **kwargs):
        with self.lock:
            self.events.append((name, kwargs))
            self.kinds.add((name, "event", tuple(sorted(kwargs))))

    def on_duration(self, name, seconds, **kwargs):
        with self.lock:
            self.durations.setdefault(name, []).append(seconds)
            self.kinds.add((name, "duration", tuple(sorted(kwargs))))

    def on_scalar(self, name, value, **kwargs):
        with self.lock:
            self.scalars.setdefault(name, []).append(value)
            self.kinds.add((name, "scalar", tuple(sorted(kwargs))))

    def of_writes(self):
        """(name, kind, keyword names) of every save event recorded."""
        with self.lock:
            return {k for k in self.kinds if k[0].startswith(("/jax/orbax/write/",
                                                               "/jax/checkpoint/write/"))}

    def names(self, prefix="/jax/"):
        with self.lock:
            return [name for name, _ in self.events if name.startswith(prefix)]

    def clear(self):
        with self.lock:
            self.events.clear()
            self.durations.clear()
            self.scalars.clear()
            self.kinds.clear()


@pytest.fixture
def recorded():
    r = Recorded()
    jax.monitoring.register_event_listener(r.on_event)
    jax.monitoring.register_event_duration_secs_listener(r.on_duration)
    jax.monitoring.register_scalar_listener(r.on_scalar)
    yield r
    jax.monitoring.unregister_event_listener(r.on_event)
    jax.monitoring.unregister_event_duration_listener(r.on_duration)
    jax.monitoring.unregister_scalar_listener(r.on_scalar)


STATE = {"w": jnp.arange(4096.0).reshape(64, 64), "b": jnp.ones(7)}


def test_a_sync_save(tmp_path, recorded):
    sk.save(tmp_path / "a", STATE)
    assert recorded.names() == ["/jax/orbax/write/start", "/jax/orbax/write/storage_type",
                                "/jax/orbax/write/success"]
    assert dict(recorded.events)["/jax/orbax/write/storage_type"] == {"storage_type": "file"}
    blocking = recorded.durations["/jax/orbax/write/blocking_duration_secs"]
    total = recorded.durations["/jax/orbax/write/total_duration_secs"]
    assert len(blocking) == len(total) == 1 and 0 < blocking[0] == total[0]
    assert len(recorded.scalars["/jax/orbax/write/start_time"]) == 1


def test_an_async_save_reports_blocking_and_background_apart(tmp_path, recorded):
    future = sk.save_async(tmp_path / "a", STATE)
    future.result()  # the end is reported before result() returns
    assert recorded.names() == ["/jax/orbax/write/async/start", "/jax/orbax/write/storage_type",
                                "/jax/orbax/write/success"]
    d = recorded.durations
    blocking = d["/jax/orbax/write/async/blocking_duration_secs"][0]
    assert d["/jax/checkpoint/write/async/blocking_duration_secs"] == [blocking]
    total = d["/jax/orbax/write/async/total_duration_secs"][0]
    assert d["/jax/checkpoint/write/async/total_duration_secs"] == [total]
    background = d["/jax/orbax/write/background_duration_secs"][0]
    assert 0 < blocking < total and background == pytest.approx(total - blocking)
    assert "/jax/orbax/write/async/blocking_end_time" in recorded.scalars


def test_a_load(tmp_path, recorded):
    sk.save(tmp_path / "a", STATE)
    recorded.clear()
    sk.load(tmp_path / "a")
    assert recorded.names() == ["/jax/orbax/read/start", "/jax/orbax/read/storage_type",
                                "/jax/orbax/read/success"]
    total = recorded.durations["/jax/orbax/read/total_duration_secs"]
    assert recorded.durations["/jax/orbax/read/blocking_duration_secs"] == total
    assert len(total) == 1 and total[0] > 0


def test_failed_saves_and_loads(tmp_path, recorded):
    sk.save(tmp_path / "a", STATE)
    recorded.clear()
    # Refused by the core when the save starts, in the background.
    with pytest.raises(sk.AlreadyExistsError):
        sk.save_async(tmp_path / "a", STATE).result()
    # Refused before staging.
    with pytest.raises(sk.InvalidArgumentError):
        sk.save(tmp_path / "b", STATE, step=-1)
    with pytest.raises(sk.NotFoundError):
        sk.load(tmp_path / "missing")
    names = recorded.names()
    assert names.count("/jax/shardkeep/write/failure") == 2
    assert names.count("/jax/shardkeep/read/failure") == 1
    assert "/jax/orbax/write/success" not in names and "/jax/orbax/read/success" not in names
    assert "/jax/orbax/write/async/total_duration_secs" not in recorded.durations


def test_the_storage_type_is_the_locations_scheme(tmp_path, recorded):
    sk.save(f"file://{tmp_path}/a", STATE)
    sk.save(f"memory://{tmp_path.name}/a", STATE)
    with pytest.raises(sk.InvalidArgumentError, match="unknown scheme 'gopher'"):
        sk.load("gopher://host/a")  # no backend reads it: its failure is still recorded
    assert [kw["storage_type"] for name, kw in recorded.events
            if name.endswith("/storage_type")] == ["file", "memory", "unknown"]
    assert recorded.names().count("/jax/shardkeep/read/failure") == 1


def test_a_manager_restore_is_a_load(tmp_path, recorded):
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, STATE)
        mgr.wait()
        recorded.clear()
        step, _ = mgr.restore()
    assert step == 1
    assert recorded.names() == ["/jax/orbax/read/start", "/jax/orbax/read/storage_type",
                                "/jax/orbax/read/success"]


# The events of a save operation as Orbax's CheckpointManager records them
# (its OperationRecorder and async checkpointer): sync, then async.
ORBAX_SYNC = {"/jax/orbax/write/start", "/jax/orbax/write/start_time",
              "/jax/orbax/write/storage_type", "/jax/orbax/write/blocking_duration_secs",
              "/jax/orbax/write/blocking_end_time", "/jax/orbax/write/success",
              "/jax/orbax/write/total_duration_secs"}
ORBAX_ASYNC = {"/jax/orbax/write/async/start", "/jax/orbax/write/async/start_time",
               "/jax/orbax/write/storage_type",
               "/jax/checkpoint/write/async/blocking_duration_secs",
               "/jax/orbax/write/async/blocking_duration_secs",
               "/jax/orbax/write/async/blocking_end_time", "/jax/orbax/write/success",
               "/jax/checkpoint/write/async/total_duration_secs",
               "/jax/orbax/write/async/total_duration_secs",
               "/jax/orbax/write/background_duration_secs"}
# The size scalars Orbax's pytree handler records, in either mode.
ORBAX_SIZES = {"/jax/orbax/write/blocking_gbytes_per_sec", "/jax/orbax/write/gbytes_per_sec",
               "/jax/orbax/write/gbytes"}
ORBAX_SYNC |= ORBAX_SIZES
ORBAX_ASYNC |= ORBAX_SIZES


def orbax_manager_save(root, recorded, *, asynchronous):
    """The save events of one save by Orbax's own CheckpointManager."""
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=asynchronous)
    with ocp.CheckpointManager(root, options=options) as mgr:
        recorded.clear()
        mgr.save(1, args=ocp.args.StandardSave(STATE))
        mgr.wait_until_finished()
    return recorded.of_writes()


def shardkeep_manager_save(root, recorded, *, asynchronous):
    with sk.CheckpointManager(root, async_save=asynchronous) as mgr:
        recorded.clear()
        mgr.save(1, STATE)
        mgr.wait()
    return recorded.of_writes()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_manager_reports_the_events_orbax_manager_reports(tmp_path, recorded, asynchronous):
    orbax = orbax_manager_save(tmp_path / "orbax", recorded, asynchronous=asynchronous)
    ours = shardkeep_manager_save(tmp_path / "shardkeep", recorded, asynchronous=asynchronous)
    expected, other = (ORBAX_ASYNC, ORBAX_SYNC) if asynchronous else (ORBAX_SYNC, ORBAX_ASYNC)
    # The lists above are what Orbax records in this mode...
    assert expected <= {name for name, _, _ in orbax}
    # ...and shardkeep records each as Orbax does: same kind, same keywords.
    assert {k for k in orbax if k[0] in expected} == {k for k in ours if k[0] in expected}
    # Nothing of the other mode that Orbax does not record in this one.
    assert not {name for name, _, _ in ours} & (other - expected)


def test_a_synchronous_managers_blocking_duration_runs_to_the_commit(tmp_path, recorded):
    committed_when_reported = []

    def on_duration(name, seconds, **kwargs):
        if name == "/jax/orbax/write/blocking_duration_secs":
            committed_when_reported.append((tmp_path / "000000001" / "_SHARDKEEP").exists())

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        with sk.CheckpointManager(tmp_path, async_save=False) as mgr:
            mgr.save(1, STATE)
            assert committed_when_reported == [True]  # reported before save() returned
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    d = recorded.durations
    assert d["/jax/orbax/write/blocking_duration_secs"] == d["/jax/orbax/write/total_duration_secs"]


STATE_GIB = (4096 + 7) * 4 / 2**30  # STATE's arrays, float32


def test_saves_report_orbaxs_size_and_throughput_scalars(tmp_path, recorded):
    for save in (sk.save, lambda path, tree: sk.save_async(path, tree).result()):
        recorded.clear()
        save(tmp_path / str(len(list(tmp_path.iterdir()))), STATE)
        s = recorded.scalars
        assert s["/jax/orbax/write/gbytes"] == [pytest.approx(STATE_GIB)]
        for name in ("/jax/orbax/write/gbytes_per_sec", "/jax/orbax/write/blocking_gbytes_per_sec"):
            assert len(s[name]) == 1 and s[name][0] > 0
        # The throughput is the size over the save's total duration.
        total, = (recorded.durations.get("/jax/orbax/write/total_duration_secs")
                  or recorded.durations["/jax/orbax/write/async/total_duration_secs"])
        assert s["/jax/orbax/write/gbytes_per_sec"][0] == pytest.approx(STATE_GIB / total)


def _read_scalars(recorded):
    return {k: v for k, v in recorded.scalars.items() if k.startswith("/jax/checkpoint/read/")}


def test_a_load_reports_orbaxs_read_scalars_as_orbax_does(tmp_path, recorded):
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "orbax", STATE)
    sk.save(tmp_path / "a", STATE)
    recorded.clear()
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.restore(tmp_path / "orbax")
    orbax = _read_scalars(recorded)
    kinds = {k for k in recorded.kinds if k[0].startswith("/jax/checkpoint/read/")}
    recorded.clear()
    sk.load(tmp_path / "a")
    ours = _read_scalars(recorded)
    assert set(orbax) == set(ours) == {"/jax/checkpoint/read/gbytes",
                                       "/jax/checkpoint/read/gbytes_per_sec"}
    assert kinds == {k for k in recorded.kinds if k[0].startswith("/jax/checkpoint/read/")}
    assert ours["/jax/checkpoint/read/gbytes"] == orbax["/jax/checkpoint/read/gbytes"] == [
        pytest.approx(STATE_GIB)]
    assert ours["/jax/checkpoint/read/gbytes_per_sec"][0] > 0


def _other_formats(tmp_path):
    """{name: a call loading STATE from a checkpoint of that format}."""
    import numpy as np
    import safetensors.numpy
    import torch
    import torch.distributed.checkpoint as dcp
    host = {k: np.array(v) for k, v in STATE.items()}
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(3, args=ocp.args.StandardSave(STATE))
        manager.wait_until_finished()
    safetensors.numpy.save_file(host, str(tmp_path / "model.safetensors"))
    dcp.save({k: torch.from_numpy(v) for k, v in host.items()},
             checkpoint_id=str(tmp_path / "dcp"), no_dist=True)

    def from_manager():
        with sk.CheckpointManager(tmp_path / "run") as mgr:
            return mgr.load(3)

    return {"load_orbax": lambda: sk.load_orbax(tmp_path / "run" / "3"),
            "load_safetensors": lambda: sk.load_safetensors(tmp_path / "model.safetensors"),
            "load_dcp": lambda: sk.load_dcp(tmp_path / "dcp", allow_pickle=True),
            "manager on an Orbax step": from_manager}


def test_loads_from_other_formats_report_as_sk_load(tmp_path, recorded):
    for name, load in _other_formats(tmp_path).items():
        recorded.clear()
        value = load()
        assert sorted(value) == ["b", "w"], name
        assert recorded.names() == ["/jax/orbax/read/start", "/jax/orbax/read/storage_type",
                                    "/jax/orbax/read/success"], name
        assert dict(recorded.events)["/jax/orbax/read/storage_type"] == {"storage_type": "file"}
        assert len(recorded.durations["/jax/orbax/read/total_duration_secs"]) == 1, name
        assert _read_scalars(recorded)["/jax/checkpoint/read/gbytes"] == [
            pytest.approx(STATE_GIB)], name


def test_failed_loads_from_other_formats_are_recorded(tmp_path, recorded):
    calls = [lambda: sk.load_orbax(tmp_path / "missing"),
             lambda: sk.load_safetensors(tmp_path / "missing.safetensors"),
             lambda: sk.load_dcp(tmp_path / "missing", allow_pickle=True)]
    for call in calls:
        with pytest.raises(sk.ShardkeepError):
            call()
    names = recorded.names()
    assert names.count("/jax/shardkeep/read/failure") == 3
    assert "/jax/orbax/read/success" not in names
    assert not _read_scalars(recorded)


def test_a_tree_whose_keys_jax_cannot_sort_reports_its_size(tmp_path, recorded):
    """{7: ..., "w": ...} is saved in its order; JAX's flattening refuses to
    sort its keys, so the size comes from shardkeep's own."""
    tree = {7: STATE["w"], "b": STATE["b"]}
    sk.save(tmp_path / "mixed", tree)
    assert recorded.scalars["/jax/orbax/write/gbytes"] == [pytest.approx(STATE_GIB)]
    recorded.clear()
    loaded = sk.load(tmp_path / "mixed")
    assert list(loaded) == [7, "b"]
    assert _read_scalars(recorded)["/jax/checkpoint/read/gbytes"] == [pytest.approx(STATE_GIB)]
