"""Saves and loads are reported through jax.monitoring under Orbax's event names."""

import threading

import jax
import jax.numpy as jnp
import pytest

import shardkeep as sk


class Recorded:
    """Every jax.monitoring event, duration and scalar while it is installed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple[str, dict]] = []
        self.durations: dict[str, list[float]] = {}
        self.scalars: dict[str, list[float]] = {}

    def on_event(self, name, **kwargs):
        with self.lock:
            self.events.append((name, kwargs))

    def on_duration(self, name, seconds, **kwargs):
        with self.lock:
            self.durations.setdefault(name, []).append(seconds)

    def on_scalar(self, name, value, **kwargs):
        with self.lock:
            self.scalars.setdefault(name, []).append(value)

    def names(self, prefix="/jax/"):
        with self.lock:
            return [name for name, _ in self.events if name.startswith(prefix)]

    def clear(self):
        with self.lock:
            self.events.clear()
            self.durations.clear()
            self.scalars.clear()


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


def test_a_manager_restore_is_a_load(tmp_path, recorded):
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, STATE)
        mgr.wait()
        recorded.clear()
        step, _ = mgr.restore()
    assert step == 1
    assert recorded.names() == ["/jax/orbax/read/start", "/jax/orbax/read/storage_type",
                                "/jax/orbax/read/success"]
