"""The SeaweedFS S3 server of the S3 workloads (W5, W8's S3 part), started
once per run by scripts/seaweed_server.py's launcher, with the benchmark's
own keys. Tools reach it through the AWS variables of ``server.env()``.

Space of deleted objects comes back only when the server compacts its
volumes (vacuum). Its own periodic vacuum is turned off, so that none runs
inside a measurement; the suite asks for one (``server.vacuum()``) between
tools, outside the clock, which also keeps a full-size run's disk use
bounded.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from seaweed_server import SeaweedServer  # noqa: E402

ACCESS_KEY = "BENCHACCESSKEY"
SECRET_KEY = "bench-secret-key"


def start(folder: str, bucket: str) -> SeaweedServer:
    """A running server with its data under ``folder`` and ``bucket`` made
    and warmed up; the caller stops it."""
    server = SeaweedServer(folder, ACCESS_KEY, SECRET_KEY,
                           extra_flags=("-master.vacuumIntervalSeconds=86400",))
    server.start()
    try:
        # The first write to a bucket makes the server allocate its volumes,
        # about a second that would otherwise fall on whichever tool writes
        # first.
        client = server.client()
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="warm-up", Body=b"\0" * (1 << 20))
        client.delete_object(Bucket=bucket, Key="warm-up")
        server.vacuum()
    except BaseException:
        server.stop()
        raise
    return server
