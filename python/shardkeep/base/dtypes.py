"""dtype names as stored in checkpoints (numpy / ml_dtypes names)."""

import functools

import ml_dtypes
import numpy as np

from ..errors import InvalidArgumentError


@functools.lru_cache(maxsize=None)
def from_name(name: str) -> np.dtype:
    """Returns the numpy dtype for a stored name such as "bfloat16" or "int4"
    (cached: a tree of thousands of leaves has only a few dtypes)."""
    custom = getattr(ml_dtypes, name, None)
    try:
        return np.dtype(custom if custom is not None else name)
    except TypeError as e:
        raise InvalidArgumentError(f"unknown dtype name {name!r}") from e


def little_endian(arr: np.ndarray) -> np.ndarray:
    """Returns ``arr`` in little-endian byte order (the stored order)."""
    if arr.dtype.byteorder == ">":
        return arr.astype(arr.dtype.newbyteorder("<"))
    return arr


def as_bytes(arr: np.ndarray) -> np.ndarray:
    """Flat uint8 view of a C-contiguous array.

    Custom dtypes (bfloat16, float8, int4) do not cross every buffer
    protocol, so array data crosses the binding untyped, with its dtype name
    beside it. Works for 0-d and zero-size arrays.
    """
    return arr.reshape(-1).view(np.uint8)


@functools.lru_cache(maxsize=None)
def name_of(dtype) -> str:
    """The stored name of a numpy dtype ("float32", "bfloat16"); cached,
    because dtype.name is slow and a tree of thousands of leaves has only a
    few dtypes."""
    return np.dtype(dtype).name


@functools.lru_cache(maxsize=None)
def is_supported(dtype) -> bool:
    """Whether arrays of ``dtype`` can be stored (numeric, bool, ml_dtypes)."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:  # JAX extended dtypes, e.g. typed PRNG keys.
        return False
    if dtype.kind == "V":  # ml_dtypes types (bfloat16, float8, int4) are kind "V".
        return getattr(ml_dtypes, dtype.name, None) is not None
    return dtype.kind in "biufc"
