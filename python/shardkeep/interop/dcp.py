"""PyTorch Distributed Checkpoint (DCP) checkpoints, read through torch.

A DCP checkpoint folder holds ``.metadata`` and data files
(``__<rank>_<n>.distcp``). ``.metadata`` is a pickle of
``torch.distributed.checkpoint.Metadata``: each flattened key ("FQN") with
its tensor's size, dtype and chunks, or a note that it is a pickled Python
value; where each chunk lies in the data files; and, when DCP flattened a
nested state dict, the original key tuple of each FQN (``planner_data``).

Unpickling runs code chosen by whoever wrote the file, so a DCP
checkpoint is only read with ``allow_pickle=True``: from a source trusted
as much as the code one runs. Tensor chunks themselves are read by torch
with ``weights_only=True``; non-tensor values (ints, strings, other
objects DCP stores as pickles) are unpickled by DCP as they are loaded.

Leaves are read one key at a time by ``torch.distributed.checkpoint.load``
into a tensor that shares memory with the numpy array returned (bfloat16
and float8 through a same-size integer view), so that a key's chunks
from any number of ranks are assembled by DCP itself, bit for bit, and
memory holds only the keys being read.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import CorruptionError, InvalidArgumentError, NotFoundError
from .optional import require
from .source import SourceLeaf
from .tree_build import key_path

PICKLE_REFUSAL = (
    "reading a PyTorch DCP checkpoint means unpickling its .metadata file (and its"
    " non-tensor values), and unpickling runs whatever code the file names: pass"
    " allow_pickle=True only for checkpoints from a source you trust as much as code"
    " you run")

# torch dtypes numpy has no type for, read through a same-size integer view.
_VIEWED = {
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
_NATIVE = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128")
_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


class DcpCheckpoint:
    """A DCP checkpoint's leaves; array reads run on ``pool``'s threads."""

    def __init__(self, path, *, allow_pickle: bool, pool: concurrent.futures.Executor):
        if not allow_pickle:
            raise InvalidArgumentError(f"DCP checkpoint {os.fspath(path)}: {PICKLE_REFUSAL}")
        self._torch = require("torch", "dcp", "reading PyTorch DCP checkpoints")
        self._dcp = require("torch.distributed.checkpoint", "dcp",
                            "reading PyTorch DCP checkpoints")
        self.directory = os.path.abspath(os.fspath(path))
        self.where = f"DCP checkpoint {self.directory}"
        self._pool = pool
        self._metadata = self._read_metadata()
        items = self._metadata.state_dict_metadata
        values = self._python_values([fqn for fqn, item in items.items()
                                      if not hasattr(item, "size")])
        self.leaves = [self._leaf(fqn, item, values) for fqn, item in items.items()]

    def _read_metadata(self):
        file = os.path.join(self.directory, ".metadata")
        if not os.path.isfile(file):
            raise NotFoundError(f"no DCP checkpoint at {self.directory}: .metadata is missing")
        try:
            return self._dcp.FileSystemReader(self.directory).read_metadata()
        except Exception as e:  # any unpickling failure: the file is not DCP metadata
            raise CorruptionError(f"{self.where}: .metadata does not decode: {e!r}") from e

    def _python_values(self, fqns: list[str]) -> dict[str, Any]:
        """The non-tensor values (BytesStorageMetadata: pickles), loaded in
        one call: they are small and many (an optimizer's step counts)."""
        if not fqns:
            return {}
        named = ", ".join(repr(f) for f in fqns[:3]) + (
            f" and {len(fqns) - 3} more" if len(fqns) > 3 else "")
        return self._load(dict.fromkeys(fqns), f"{self.where}: values of keys {named}")

    def _leaf(self, fqn: str, item, values: dict[str, Any]) -> SourceLeaf:
        keys = self._keys(fqn)
        path = key_path(keys)
        where = f"{self.where}: key {fqn!r} (leaf {path!r})"
        if fqn in values:
            value = values[fqn]
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise InvalidArgumentError(
                    f"{where}: holds a {type(value).__name__}; shardkeep stores Python values"
                    " only of types bool, int, float, str and None")
            return SourceLeaf(keys, path, where, value=value)
        torch_dtype = str(item.properties.dtype).removeprefix("torch.")
        if torch_dtype in _VIEWED:
            dtype = np.dtype(_VIEWED[torch_dtype])
        elif torch_dtype in _NATIVE:
            dtype = np.dtype(torch_dtype)
        else:
            raise InvalidArgumentError(f"{where}: torch dtype {torch_dtype} has no numpy form")
        shape = tuple(int(n) for n in item.size)
        return SourceLeaf(keys, path, where, shape=shape, dtype=dtype,
                          read_box=lambda origin, extent: self._read_box(
                              fqn, where, shape, dtype, item.properties.dtype, origin, extent))

    def _keys(self, fqn: str):
        """The leaf's keys: DCP's record of the nested state dict (ints are
        list positions), or the FQN itself as one dict key."""
        original = (getattr(self._metadata, "planner_data", None) or {}).get(fqn)
        if not original:
            return [(fqn, False)]
        return [(str(k), isinstance(k, int)) for k in original]

    def _read_box(self, fqn, where, shape, dtype, torch_dtype, origin, extent):
        if tuple(origin) != (0,) * len(shape) or tuple(extent) != shape:
            raise InvalidArgumentError(f"{where}: DCP leaves are read whole")
        return self._pool.submit(self._read_whole, fqn, where, shape, dtype, torch_dtype)

    def _read_whole(self, fqn, where, shape, dtype, torch_dtype) -> np.ndarray:
        array = np.empty(shape, dtype)
        if dtype.name in _VIEWED:
            view = self._torch.from_numpy(array.view(_INT_OF_SIZE[dtype.itemsize]))
            tensor = view.view(torch_dtype)
        else:
            tensor = self._torch.from_numpy(array)
        self._load({fqn: tensor}, where)
        return array

    def _load(self, state_dict: dict, where: str) -> dict:
        """DCP's own load of ``state_dict``'s keys, metadata not unpickled again."""
        reader = _reader_class(self._dcp)(self.directory, self._metadata)
        try:
            self._dcp.load(state_dict, storage_reader=reader, no_dist=True)
        except (Exception, self._dcp.api.CheckpointException) as e:
            cause = _first_failure(e)
            if isinstance(cause, FileNotFoundError):
                raise NotFoundError(f"{where}: data file {cause.filename or cause} is"
                                    " missing") from e
            # torch.load and DCP raise assorted types on bad bytes.
            files = sorted({info.relative_path for index, info in
                            self._metadata.storage_data.items() if index.fqn in state_dict})
            raise CorruptionError(f"{where}: reading it from {', '.join(files)} failed:"
                                  f" {_first_line(cause)}") from e
        return state_dict


@functools.cache
def _reader_class(dcp):
    """FileSystemReader handing out metadata already read, so that loading
    key after key does not unpickle ``.metadata`` again each time."""

    class KnownMetadataReader(dcp.FileSystemReader):
        def __init__(self, directory: str, metadata):
            super().__init__(directory)
            self._known_metadata = metadata

        def read_metadata(self, *args, **kwargs):
            return self._known_metadata

    return KnownMetadataReader


def _first_failure(e: BaseException) -> BaseException:
    """The error behind DCP's CheckpointException (one per rank; we are one)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        wrapped = next(iter(failures.values()))
        return wrapped[0] if isinstance(wrapped, tuple) else wrapped
    return e


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:500]
