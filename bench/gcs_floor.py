"""W10's floor: the state's bytes moved to and from GCS (the emulator) by
google-cloud-storage's transfer manager, as a hand-written checkpoint
would move them.

The bytes and their grouping are W5's (s3_floor.py): one object per
device, each the concatenation of that device's FSDP rows of every leaf.
upload_many sends the 8 objects in parallel threads (each one request,
with its CRC32C, as the library does by default); download_many gets them
back into buffers allocated inside the timed region, checked against the
CRC32C the server reports, as a load must allocate what it returns.
"""

from __future__ import annotations

import time

import numpy as np

import gcs_objects
import object_stores
import s3_floor

THREADS = 8


def _blobs(root: str, workload: str):
    bucket, prefix = gcs_objects.split(object_stores.join(root, "floor", workload))
    handle = gcs_objects.client().bucket(bucket)
    return [handle.blob(f"{prefix}/group-{d}.bin") for d in range(s3_floor.DEVICES)]


def upload(root: str, workload: str, scale: str, reset_peak) -> dict:
    from google.cloud.storage import transfer_manager
    buffers = [s3_floor.group(workload, scale, d) for d in range(s3_floor.DEVICES)]
    blobs = _blobs(root, workload)
    reset_peak()
    start = time.perf_counter()
    results = transfer_manager.upload_many(
        [(s3_floor.BufferFile(b), blob) for b, blob in zip(buffers, blobs)],
        max_workers=THREADS, worker_type=transfer_manager.THREAD, raise_exception=True)
    seconds = time.perf_counter() - start
    assert all(r is None for r in results), results
    return {"seconds": seconds, "stored_bytes": sum(b.size for b in buffers)}


def download(root: str, workload: str, scale: str, reset_peak) -> dict:
    from google.cloud.storage import transfer_manager
    blobs = _blobs(root, workload)
    sizes = s3_floor.group_bytes(workload, scale)
    reset_peak()
    start = time.perf_counter()
    buffers = [np.empty(size, np.uint8) for size in sizes]
    transfer_manager.download_many(
        [(blob, s3_floor.BufferFile(b)) for blob, b in zip(blobs, buffers)],
        max_workers=THREADS, worker_type=transfer_manager.THREAD, raise_exception=True)
    seconds = time.perf_counter() - start
    verified = bool(np.array_equal(buffers[0], s3_floor.group(workload, scale, 0)))
    return {"seconds": seconds, "verified": verified}
