"""Host buffers for loads and async staging (shardkeep.base.host_memory, host_copy)."""

import gc

import jax
import ml_dtypes
import numpy as np
import pytest

import shardkeep
from shardkeep.base import host_copy, host_memory


@pytest.mark.parametrize("shape,dtype", [
    ((), np.float32), ((0, 5), np.int8), ((3, 7), np.float64),       # numpy allocator
    ((1024, 1024), np.float32), ((3, 1 << 20), ml_dtypes.bfloat16),  # huge-page mappings
])
def test_empty_is_aligned_writable_and_of_the_asked_shape(shape, dtype):
    buf = host_memory.empty(shape, dtype)
    assert buf.shape == shape and buf.dtype == np.dtype(dtype)
    assert buf.size == 0 or buf.ctypes.data % 64 == 0  # no address to align without bytes
    assert buf.flags.c_contiguous and buf.flags.writeable
    buf[...] = 1
    assert np.all(buf == 1)


def test_large_buffer_outlives_its_creator_through_views():
    view = host_memory.empty((4 << 20,), np.uint8)[10:20]
    gc.collect()
    view[:] = 7  # the mapping is still alive while a view exports it
    assert view.tolist() == [7] * 10


@pytest.mark.parametrize("sizes", [(17, 3, 1000), (17, 5 << 20, 6 << 20, 3)])  # serial, threaded
def test_copy_all_copies_every_source_into_its_destination(sizes):
    rng = np.random.default_rng(0)
    sources = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    destinations = [np.zeros_like(s) for s in sources]
    host_copy.copy_all(sources, destinations)
    for src, dst in zip(sources, destinations):
        assert not np.shares_memory(src, dst)
        np.testing.assert_array_equal(dst, src)


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


def test_arena_carves_small_aligned_buffers_and_maps_large_ones():
    arena = host_memory.Arena()
    small = [arena.empty((n,), np.float32) for n in (1, 7, 1000, 0)]
    scalar = arena.empty((), np.int64)
    large = arena.empty((1 << 20,), np.float32)
    for i, buf in enumerate(small + [scalar, large]):
        assert buf.size == 0 or buf.ctypes.data % 64 == 0
        buf[...] = i
    for i, buf in enumerate(small):
        assert np.all(buf == i)  # carved buffers do not overlap
    assert scalar.shape == () and scalar == 4
    assert not np.shares_memory(large, small[2])


def test_arena_starts_a_new_slab_when_one_is_full():
    arena = host_memory.Arena()
    count = 3 * host_memory.Arena.SLAB_BYTES // (1 << 20)
    bufs = [arena.empty((1 << 18,), np.float32) for _ in range(count)]  # 1 MiB each
    for i, buf in enumerate(bufs):
        buf[:] = i
    assert [int(b[0]) for b in bufs] == list(range(count))
    assert [int(b[-1]) for b in bufs] == list(range(count))


def test_background_copies_run_while_the_caller_goes_on_and_finish_waits():
    from shardkeep import _core

    rng = np.random.default_rng(0)
    sources = [rng.integers(0, 255, n, dtype=np.uint8) for n in (1, 4096, 3 << 20, 7 << 20)]
    destinations = [np.zeros(s.size, np.uint8) for s in sources]
    copier = _core.BackgroundCopy(2, batch_bytes=1 << 20)
    for s, d in zip(sources, destinations):
        copier.add(s, d)
    copier.finish()
    assert all(np.array_equal(s, d) for s, d in zip(sources, destinations))
    with pytest.raises(ValueError, match="sizes differ"):
        copier.add(sources[0], destinations[1])
    readonly = sources[1].copy()
    readonly.flags.writeable = False
    destinations[1][:] = 0
    copier.add(readonly, destinations[1])  # a read-only source (a jax buffer's view)
    copier.finish()
    assert np.array_equal(readonly, destinations[1])
