"""The few object-store chores the harness does itself on GCS (W10): split a
``gs://bucket/prefix`` URL, total the bytes under a prefix, delete it.

The client is google-cloud-storage's, anonymous, pointed at the emulator by
the STORAGE_EMULATOR_HOST the suite sets for W10: that of this process, or
of the mapping ``env`` where a function takes one.
"""

from __future__ import annotations

import os


def is_gs(path: str) -> bool:
    return path.startswith("gs://")


def split(url: str) -> tuple[str, str]:
    """("bucket", "name/prefix") of ``gs://bucket/name/prefix``."""
    bucket, _, name = url[len("gs://"):].partition("/")
    return bucket, name


def client(env=None):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    env = os.environ if env is None else env
    return storage.Client(project="bench", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": env["STORAGE_EMULATOR_HOST"]})


def _blobs(url: str, env=None):
    bucket, prefix = split(url)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    return list(client(env).list_blobs(bucket, prefix=prefix))


def prefix_bytes(url: str) -> int:
    return sum(blob.size or 0 for blob in _blobs(url))


def exists(url: str) -> bool:
    return bool(_blobs(url))


def delete_prefix(url: str, env=None) -> None:
    for blob in _blobs(url, env):
        blob.delete()
