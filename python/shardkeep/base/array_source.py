"""Array leaves saved from a function instead of from memory."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from . import dtypes
from ..errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class ArraySource:
    """A pytree leaf whose values a function produces while the save writes.

    ``read(origin, shape)`` returns the values of the box starting at
    ``origin`` with extents ``shape`` (tuples of ints), as an array of that
    shape (its dtype is converted to ``dtype``). The save calls it on its
    writer threads, one chunk (``Options.chunk_bytes``) at a time, so a tree
    of sources is saved holding a chunk per writer thread, however large it
    is: conversions from other formats stream this way. ``read`` must be
    thread-safe and stay valid until the save has committed. The leaf is
    written by process 0 and loads back as an ordinary array.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    read: Callable[[tuple[int, ...], tuple[int, ...]], np.ndarray]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    def fill(self, origin: list[int], shape: list[int]) -> np.ndarray:
        """The bytes of one box, flat uint8 (the core calls this per chunk)."""
        values = np.asarray(self.read(tuple(origin), tuple(shape)))
        if values.shape != tuple(shape):
            raise InvalidArgumentError(
                f"an ArraySource's read gave shape {values.shape} for a box of shape "
                f"{tuple(shape)} at {tuple(origin)}")
        values = np.ascontiguousarray(dtypes.little_endian(values.astype(self.dtype, copy=False)))
        return dtypes.as_bytes(values)
