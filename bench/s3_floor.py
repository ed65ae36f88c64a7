"""W5's floor: the state's bytes moved to and from the S3 server by a
well-tuned generic client, boto3's managed transfer (s3transfer).

The bytes are W1's, grouped as the devices hold them: one object per
device, each the concatenation of that device's FSDP rows of every leaf
(8 objects of 1/8 of the state). That is the unit a hand-written
checkpoint would upload. All objects go through one TransferManager, so
several objects and several parts of each are in flight at once and
THREADS bounds the requests in flight in total; one big object in parts
of PART_BYTES would keep as many requests busy, but objects below
PART_BYTES go up as single PUTs, with no multipart overhead.

upload: from memory (the buffers exist before the clock starts), timed
until every object is complete. download: into buffers allocated inside
the timed region, as a load must allocate what it returns.
"""

from __future__ import annotations

import os
import time

import numpy as np

import object_stores
import s3_objects
import workloads

PART_BYTES = 64 << 20  # parts of 64 MiB, objects above that go multipart
THREADS = 8            # requests in flight (boto3's default is 10, parts of 8 MiB)
DEVICES = 8


def transfer_config():
    from boto3.s3.transfer import TransferConfig
    return TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
                          max_concurrency=THREADS, use_threads=True)


def group_bytes(workload: str, scale: str) -> list[int]:
    sizes = [0] * DEVICES
    for leaf in workloads.leaves(workload, scale):
        for d in range(DEVICES):
            sizes[d] += leaf.nbytes // DEVICES
    return sizes


def group(workload: str, scale: str, device: int) -> np.ndarray:
    """Device ``device``'s rows of every leaf, concatenated (uint8)."""
    buffer = np.empty(group_bytes(workload, scale)[device], np.uint8)
    at = 0
    for leaf in workloads.leaves(workload, scale):
        rows = leaf.shape[0] // DEVICES
        part = workloads.leaf_values(leaf, slice(device * rows, (device + 1) * rows))
        raw = part.reshape(-1).view(np.uint8)
        buffer[at:at + raw.size] = raw
        at += raw.size
    assert at == buffer.size, (at, buffer.size)
    return buffer


class BufferFile:
    """A seekable file over a numpy buffer: what s3transfer reads parts
    from and writes ranged GETs into, without a copy of the whole object."""

    def __init__(self, buffer: np.ndarray):
        self.view = memoryview(buffer).cast("B")
        self.pos = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: len(self.view)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        end = len(self.view) if size is None or size < 0 else min(len(self.view),
                                                                    self.pos + size)
        data = bytes(self.view[self.pos:end])
        self.pos = end
        return data

    def close(self) -> None:  # the buffer belongs to the caller
        pass

    def write(self, data) -> int:
        n = len(data)
        self.view[self.pos:self.pos + n] = data
        self.pos += n
        return n


def _keys(root: str, workload: str) -> tuple[str, list[str]]:
    bucket, prefix = s3_objects.split(object_stores.join(root, "floor", workload))
    return bucket, [f"{prefix}/group-{d}.bin" for d in range(DEVICES)]


def _manager():
    from boto3.s3.transfer import create_transfer_manager
    return create_transfer_manager(s3_objects.client(), transfer_config())


def upload(root: str, workload: str, scale: str, reset_peak) -> dict:
    buffers = [group(workload, scale, d) for d in range(DEVICES)]
    bucket, keys = _keys(root, workload)
    with _manager() as manager:
        reset_peak()
        start = time.perf_counter()
        futures = [manager.upload(BufferFile(b), bucket, key)
                   for b, key in zip(buffers, keys)]
        for future in futures:
            future.result()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "stored_bytes": sum(b.size for b in buffers)}


def download(root: str, workload: str, scale: str, reset_peak) -> dict:
    bucket, keys = _keys(root, workload)
    sizes = group_bytes(workload, scale)
    with _manager() as manager:
        reset_peak()
        start = time.perf_counter()
        buffers = [np.empty(size, np.uint8) for size in sizes]
        futures = [manager.download(bucket, key, BufferFile(b))
                   for b, key in zip(buffers, keys)]
        for future in futures:
            future.result()
        seconds = time.perf_counter() - start
    # Spot check outside the clock: device 0's group is the state's bytes.
    verified = bool(np.array_equal(buffers[0], group(workload, scale, 0)))
    return {"seconds": seconds, "verified": verified}
