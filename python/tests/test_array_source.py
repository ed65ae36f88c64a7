"""ArraySource leaves: produced chunk by chunk on the writer threads, so a
save holds a chunk per thread, never the state."""

import threading

import ml_dtypes
import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits


class Recorder:
    """A read function over a host array that records the boxes asked for."""

    def __init__(self, values):
        self.values = values
        self.boxes = []
        self.lock = threading.Lock()

    def __call__(self, origin, shape):
        with self.lock:
            self.boxes.append((origin, shape))
        return self.values[tuple(slice(o, o + n) for o, n in zip(origin, shape))]


def test_sources_are_read_one_chunk_at_a_time_and_load_back(tmp_path):
    big = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 2 MiB
    small = np.linspace(-1, 1, 24).astype(ml_dtypes.bfloat16).reshape(4, 6)
    read_big, read_small = Recorder(big), Recorder(small)
    tree = {"w": sk.ArraySource(big.shape, big.dtype, read_big),
            "emb": {"b": sk.ArraySource(small.shape, small.dtype, read_small)}, "step": 3}
    options = sk.Options(chunk_bytes=64 << 10, io_threads=3)
    sk.save(tmp_path / "c", tree, options=options)
    chunk_bytes = [np.prod(shape) * 4 for _, shape in read_big.boxes]
    assert len(read_big.boxes) == 32 and max(chunk_bytes) <= 64 << 10
    assert sum(chunk_bytes) == big.nbytes  # every element read once
    loaded = sk.load(tmp_path / "c")
    assert_same_bits(loaded["w"], big)
    assert_same_bits(loaded["emb"]["b"], small)
    assert loaded["step"] == 3


def test_an_async_save_reads_sources_in_the_background(tmp_path):
    values = np.arange(1000, dtype=np.int64)
    future = sk.save_async(tmp_path / "c", {"x": sk.ArraySource((1000,), np.int64, Recorder(values))})
    future.result()
    assert_same_bits(sk.load(tmp_path / "c")["x"], values)


def test_a_failing_source_fails_the_save_naming_the_leaf(tmp_path):
    def broken(origin, shape):
        raise OSError("the source file vanished")

    with pytest.raises(sk.ShardkeepError, match=r"layers/0.*vanished"):
        sk.save(tmp_path / "c", {"layers": [sk.ArraySource((8,), np.float32, broken)]})
    with pytest.raises(sk.NotFoundError):
        sk.load(tmp_path / "c")


def test_a_source_of_the_wrong_shape_is_refused(tmp_path):
    source = sk.ArraySource((8,), np.float32, lambda origin, shape: np.zeros(3, np.float32))
    with pytest.raises(sk.ShardkeepError, match="shape"):
        sk.save(tmp_path / "c", {"x": source})
