"""Meshes and arrays over every device of a multi-process job, for the
scenarios that run in its processes."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, Sharding


def job_devices() -> np.ndarray:
    """Every device of the job, process-major (then by id)."""
    return np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))


def job_mesh(rows: int, axes: tuple[str, str] = ("data", "model")) -> Mesh:
    """A 2-D mesh of ``rows`` rows over the job's devices in order."""
    return Mesh(job_devices().reshape(rows, -1), axes)


def job_array(value: np.ndarray, sharding: Sharding) -> jax.Array:
    """``value`` (the same on every process) as a global array; each process
    puts only its own shards."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
