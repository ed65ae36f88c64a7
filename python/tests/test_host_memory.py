"""Host buffers for loads and async staging (shardkeep.host_memory)."""

import gc

import jax
import ml_dtypes
import numpy as np
import pytest

import shardkeep
from shardkeep import host_memory


@pytest.mark.parametrize("shape,dtype", [
    ((), np.float32), ((0, 5), np.int8), ((3, 7), np.float64),       # numpy allocator
    ((1024, 1024), np.float32), ((3, 1 << 20), ml_dtypes.bfloat16),  # huge-page mappings
])
def test_empty_is_aligned_writable_and_of_the_asked_shape(shape, dtype):
    buf = host_memory.empty(shape, dtype)
    assert buf.shape == shape and buf.dtype == np.dtype(dtype)
    assert buf.ctypes.data % 64 == 0
    assert buf.flags.c_contiguous and buf.flags.writeable
    buf[...] = 1
    assert np.all(buf == 1)


def test_large_buffer_outlives_its_creator_through_views():
    view = host_memory.empty((4 << 20,), np.uint8)[10:20]
    gc.collect()
    view[:] = 7  # the mapping is still alive while a view exports it
    assert view.tolist() == [7] * 10


def test_copies_of_copies_all_but_the_skipped_ones_in_parallel():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (17, 5 << 20, 6 << 20, 3)]
    skip = [False, False, True, False]
    copies = host_memory.copies_of(arrays, skip=skip)  # 44 MiB + 40 MiB: threaded path
    assert copies[2] is arrays[2]
    for i in (0, 1, 3):
        assert copies[i] is not arrays[i]
        assert not np.shares_memory(copies[i], arrays[i])
        np.testing.assert_array_equal(copies[i], arrays[i])
        assert copies[i].ctypes.data % 64 == 0


def test_device_put_adopts_a_large_buffer_without_copying():
    buf = host_memory.empty((1 << 20,), np.float32)
    buf[:] = 3
    arr = jax.device_put(buf, jax.devices()[0])
    assert arr.unsafe_buffer_pointer() == buf.ctypes.data


def test_save_and_load_leave_the_garbage_collector_as_they_found_it(tmp_path):
    tree = {"a": np.arange(6, dtype=np.int32)}
    assert gc.isenabled()
    shardkeep.save(tmp_path / "on", tree)
    assert gc.isenabled()
    shardkeep.load(tmp_path / "on")
    assert gc.isenabled()
    gc.disable()
    try:
        shardkeep.save(tmp_path / "off", tree)
        shardkeep.load(tmp_path / "off")
        assert not gc.isenabled()
    finally:
        gc.enable()
