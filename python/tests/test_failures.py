"""Crashes, corruption, overwrites and donation never yield a wrong checkpoint."""

import glob
import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardkeep as sk
from file_edits import flip_byte

_TESTS_DIR = os.path.dirname(__file__)


def test_flipped_byte_is_corruption_naming_leaf_and_file(ckpt):
    sk.save(ckpt, {"layer": {"kernel": np.arange(4096, dtype=np.float32)}},
            options=sk.Options(chunk_bytes=4096, io_threads=1))  # one data file
    (data_file,) = glob.glob(os.path.join(ckpt, "state", "data", "*.bin"))
    flip_byte(data_file, 5000)
    with pytest.raises(sk.CorruptionError) as info:
        sk.load(ckpt)
    message = str(info.value)
    assert "layer/kernel" in message and os.path.basename(data_file) in message


def test_missing_commit_record_is_not_found(ckpt, tmp_path):
    sk.save(ckpt, {"a": np.ones(2)})
    os.remove(os.path.join(ckpt, "_SHARDKEEP"))
    with pytest.raises(sk.NotFoundError):
        sk.load(ckpt)
    with pytest.raises(FileNotFoundError):  # Also a built-in class.
        sk.metadata(str(tmp_path / "never_saved"))


def test_existing_checkpoint_needs_force(ckpt):
    sk.save(ckpt, {"a": np.zeros(3)})
    with pytest.raises(sk.AlreadyExistsError):
        sk.save(ckpt, {"a": np.ones(3)})
    np.testing.assert_array_equal(sk.load(ckpt)["a"], np.zeros(3))
    sk.save(ckpt, {"a": np.ones(3), "b": 2}, force=True)
    out = sk.load(ckpt)
    np.testing.assert_array_equal(out["a"], np.ones(3))
    assert out["b"] == 2


def test_donation_after_save_async_returns(ckpt):
    x = jax.device_put(jnp.arange(4 << 20, dtype=jnp.float32))
    expected = np.asarray(x).copy()
    future = sk.save_async(ckpt, {"x": x}, options=sk.Options(chunk_bytes=64 << 10))
    bump = jax.jit(lambda v: v + 1, donate_argnums=0)
    original, x = x, bump(x)
    x = bump(x)
    # The save holds host copies, not views that would pin the device
    # buffer and silently turn the donation into a copy.
    assert original.is_deleted()
    future.result(timeout=120)
    np.testing.assert_array_equal(sk.load(ckpt)["x"], expected)


_KILLED_SAVE = textwrap.dedent("""
    import glob, os, signal, sys, time
    import numpy as np
    import shardkeep as sk
    path = sys.argv[1]
    state = {"big": np.ones((300 << 20) // 4, np.float32)}
    future = sk.save_async(path, state, options=sk.Options(chunk_bytes=256 << 10,
                                                           io_threads=2))
    deadline = time.monotonic() + 60
    while not glob.glob(path + ".shardkeep-tmp/state/data/*.bin"):
        if time.monotonic() > deadline:
            sys.exit("no data file appeared")
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_killed_save_leaves_no_checkpoint(ckpt):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, ckpt], env=env,
                          cwd=_TESTS_DIR, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert glob.glob(ckpt + ".shardkeep-tmp/state/data/*.bin")
    assert not os.path.exists(os.path.join(ckpt, "_SHARDKEEP"))
    with pytest.raises(sk.NotFoundError):
        sk.load(ckpt)
    sk.save(ckpt, {"small": np.arange(5)})
    np.testing.assert_array_equal(sk.load(ckpt)["small"], np.arange(5))
    assert not os.path.exists(ckpt + ".shardkeep-tmp")


_DROPPED_FUTURE = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import shardkeep as sk
    path = sys.argv[1]
    sk.save_async(path, {"big": np.ones((64 << 20) // 4, np.float32)},
                  options=sk.Options(chunk_bytes=256 << 10))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(path, "_SHARDKEEP")):
        if time.monotonic() > deadline:
            sys.exit("never committed")
        time.sleep(0.01)
    assert float(sk.load(path)["big"].sum()) == (64 << 20) // 4
""")


def test_dropped_future_still_commits(ckpt):
    # Fire-and-forget: the save must keep its buffers alive by itself.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _DROPPED_FUTURE, ckpt], env=env,
                          cwd=_TESTS_DIR, capture_output=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode()[-2000:])


def test_future_timeout_raises_shardkeep_timeout(ckpt):
    future = sk.save_async(ckpt, {"a": np.ones(1 << 22, np.float32)},
                           options=sk.Options(chunk_bytes=4 << 10, io_threads=1))
    try:
        future.result(timeout=0)
    except sk.TimeoutError as e:
        assert isinstance(e, TimeoutError) and ckpt in str(e)
    future.result(timeout=120)


def test_errors_name_the_url_the_caller_gave():
    # The engine sees only the path inside the storage ("naming/absent");
    # the error must name the URL, which for s3:// holds the bucket.
    with pytest.raises(sk.NotFoundError, match="memory://naming/absent"):
        sk.load("memory://naming/absent")
    with pytest.raises(sk.NotFoundError, match="memory://naming/absent"):
        sk.metadata("memory://naming/absent")
