"""Test setup: 8 CPU devices, configured before anything imports jax."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The S3 fixtures (a SeaweedFS server, fresh buckets, a fault-injecting proxy).
from s3_fault_proxy import s3_proxy  # noqa: E402,F401
from s3_server import s3, s3_server  # noqa: E402,F401
# The GCS fixtures (fake-gcs-server, fresh buckets).
from gcs_server import gcs, gcs_server  # noqa: E402,F401


@pytest.fixture
def ckpt(tmp_path):
    """A checkpoint path that does not exist yet."""
    return str(tmp_path / "ckpt")


def make_mesh(shape, names, devices=None):
    """A Mesh with Auto axes (jax.make_mesh defaults to Explicit ones)."""
    devices = jax.devices() if devices is None else devices
    return jax.sharding.Mesh(np.array(devices).reshape(shape), names)


def assert_same_bits(actual, expected):
    """Equal dtype, shape and bytes (NaN-safe, works for every ml_dtype)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.tobytes() == expected.tobytes()


def sample_array(name, shape=(3, 5), seed=0):
    """Random values of the dtype called `name` (numpy or ml_dtypes), over
    the dtype's whole range for integers."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name in ("int4", "uint4"):
        lo = -8 if name == "int4" else 0
        return rng.integers(lo, lo + 16, shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    return rng.normal(size=shape).astype(dtype)
