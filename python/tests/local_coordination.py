"""A one-process stand-in for JAX's coordination service, for tests.

Its barrier runs a hook first (to stall, hold or fail a save at a chosen phase);
its key-value store is write-once like JAX's. ``install`` makes every save
of this process use it instead of the trivial single-process coordinator.
"""

from __future__ import annotations

import threading

from shardkeep import _core
from shardkeep.job import distributed


class LocalCoordination:
    def __init__(self, on_barrier=None):
        self.on_barrier = on_barrier
        self._values: dict[str, str] = {}
        self._lock = threading.Lock()

    def barrier(self, key: str, timeout_s: float) -> None:
        if self.on_barrier is not None:
            self.on_barrier(key)

    def set(self, key: str, value: str) -> None:
        with self._lock:
            if key in self._values:
                raise FileExistsError(f"key '{key}' is already set")
            self._values[key] = value

    def get(self, key: str, timeout_s: float) -> str:
        with self._lock:
            if key not in self._values:
                raise TimeoutError(f"key '{key}' was never set")
            return self._values[key]

    def try_get(self, key: str):
        with self._lock:
            return self._values.get(key)

    def keys(self, prefix: str) -> list[str]:
        with self._lock:
            return [key for key in self._values if key.startswith(prefix)]

    def delete(self, key: str) -> None:
        with self._lock:
            self._values.pop(key, None)

    def core(self):
        return _core.callback_coordinator(0, 1, self.barrier, self.set, self.get,
                                          self.try_get, self.keys, self.delete)

    def install(self, monkeypatch=None) -> None:
        if monkeypatch is not None:
            monkeypatch.setattr(distributed, "coordinator", self.core)
        else:
            distributed.coordinator = self.core


def stall_at(phase: str, seconds: float, then=None):
    """A barrier hook that sleeps at barrier `phase` ("prepared", "written"),
    then calls `then` (which may raise)."""
    import time

    def hook(key: str) -> None:
        if key.endswith("/" + phase):
            time.sleep(seconds)
            if then is not None:
                then()
    return hook


class Gate:
    """A barrier hook that holds every save arriving at barrier `phase`
    until `open()`: a test orders its steps by the save's phase, not by a
    clock. `reached` is set as a save arrives. A gate never opened lets the
    save go on after `limit_s` (a bound on a stuck test, far above any wait
    a test means) and sets `gave_up`: a step that should have happened
    while the save was held did not."""

    def __init__(self, phase: str, limit_s: float = 300.0):
        self.phase = phase
        self.limit_s = limit_s
        self.reached = threading.Event()
        self.gave_up = False
        self._opened = threading.Event()

    def __call__(self, key: str) -> None:
        if key.endswith("/" + self.phase):
            self.reached.set()
            if not self._opened.wait(self.limit_s):
                self.gave_up = True

    def wait_reached(self) -> None:
        assert self.reached.wait(self.limit_s), f"no save reached {self.phase!r}"

    def open(self) -> None:
        self._opened.set()
