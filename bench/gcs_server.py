"""The GCS emulator of W10 (fake-gcs-server, objects in memory; its
filesystem backend lost the bucket and uploads under DCP's saves), started
once per run by
scripts/gcs_emulator.py's launcher. Tools reach it through the variables of
``env(endpoint)``: STORAGE_EMULATOR_HOST for shardkeep, google-cloud-storage
and gcsfs (DCP), TENSORSTORE_GCS_HTTP_URL and a test token for
TensorStore (Orbax), and gcsfs's newer bucket-type probe (gRPC, which the
emulator does not serve; each probe waits out a 60 s timeout) turned off.
"""

from __future__ import annotations

import os
import pathlib
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from gcs_emulator import GcsEmulator  # noqa: E402


def start(folder: str, bucket: str) -> GcsEmulator:
    """A running emulator with ``bucket`` made; the caller stops it."""
    os.makedirs(folder, exist_ok=True)
    emulator = GcsEmulator(pathlib.Path(folder) / "fake-gcs-server.log")
    emulator.start()
    try:
        emulator.create_bucket(bucket)
    except BaseException:
        emulator.stop()
        raise
    return emulator


def env(endpoint: str) -> dict:
    return {"STORAGE_EMULATOR_HOST": endpoint, "TENSORSTORE_GCS_HTTP_URL": endpoint,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
