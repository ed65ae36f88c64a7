"""_core.storage_bytes_read: the bytes this process read through the
storage backends, counted by the backends themselves. Mapped files are not
read through storage, so these loads use Options(map_files=False)."""

import os

import numpy as np

import shardkeep as sk
from shardkeep import _core

READ = sk.Options(map_files=False)


def _file_bytes(ckpt, *relative):
    return sum(os.path.getsize(os.path.join(ckpt, r)) for r in relative)


def test_a_load_counts_its_data_and_metadata_bytes(ckpt):
    rng = np.random.default_rng(0)
    state = {"w": rng.standard_normal((256, 128)).astype(np.float32),
             "b": rng.integers(0, 9, (1000,), dtype=np.int64)}
    sk.save(ckpt, state)
    data = state["w"].nbytes + state["b"].nbytes
    metadata = _file_bytes(ckpt, "_SHARDKEEP", "state/meta.json", "state/index/p0.idx")
    before = _core.storage_bytes_read()
    loaded = sk.load(ckpt, options=READ)
    np.testing.assert_array_equal(loaded["w"], state["w"])
    assert _core.storage_bytes_read() - before == data + metadata

    # A partial load reads only its leaves' chunks.
    before = _core.storage_bytes_read()
    only_b = sk.load(ckpt, {"b": np.zeros(1000, np.int64)}, partial=True, options=READ)
    np.testing.assert_array_equal(only_b["b"], state["b"])
    assert _core.storage_bytes_read() - before == state["b"].nbytes + metadata


def test_mapped_files_are_not_read_through_storage(ckpt):
    w = np.arange(1 << 16, dtype=np.float32)
    sk.save(ckpt, {"w": w})
    before = _core.storage_bytes_read()
    loaded = sk.load(ckpt, options=sk.Options(map_files=True))
    np.testing.assert_array_equal(loaded["w"], w)
    assert _core.storage_bytes_read() - before < w.nbytes
