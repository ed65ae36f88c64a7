"""Leaves of another format's checkpoint, read lazily.

A source (an Orbax item, a DCP checkpoint) is described as a list of
``SourceLeaf``: its key path, its kind, and for arrays a function that
reads any box of it. Loading onto a target reads just the boxes it needs;
conversion hands each array to the save as a ``shardkeep.ArraySource``,
read chunk by chunk as the save writes it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .tree_build import Key

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (origin, extent)


class Pending(Protocol):
    """A read in flight: tensorstore's futures and concurrent.futures both fit."""

    def result(self) -> np.ndarray: ...


@dataclasses.dataclass
class SourceLeaf:
    """One leaf of a source checkpoint.

    Attributes:
      keys: its place in the source's tree (see ``tree_build``).
      path: its shardkeep key path.
      where: how error messages name it (file or array, and the leaf).
      shape, dtype: for arrays, as stored; None otherwise.
      value: for other leaves (str, None, Python scalars), the value.
      read_box: for arrays, starts reading box (origin, extent) in the
        stored dtype; the result is a new C-contiguous numpy array.
      python_scalar: an array of shape () that the source wrote for a
        Python scalar; given back as one when no target asks otherwise.
    """

    keys: Sequence[Key]
    path: str
    where: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    value: Any = None
    read_box: Callable[[tuple[int, ...], tuple[int, ...]], Pending] | None = None
    python_scalar: bool = False

    @property
    def is_array(self) -> bool:
        return self.read_box is not None

    @property
    def nbytes(self) -> int:
        if not self.is_array:
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def read_whole(self) -> Pending:
        return self.read_box((0,) * len(self.shape), tuple(self.shape))

    def plain_value(self, array: np.ndarray) -> Any:
        """The leaf as loaded without a target."""
        return array.item() if self.python_scalar else array


def thread_reads(max_workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """A pool for sources whose reads block (torch); the caller shuts it down."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=max_workers,
                                                 thread_name_prefix="shardkeep-interop")
