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
into a tensor that shares memory with a numpy array (bfloat16 and float8
through a same-size integer view), so that a key's chunks from any number
of ranks are assembled by DCP itself, bit for bit, and memory holds only
the keys being read. ``DcpSource`` describes the checkpoint as meta.json
would and serves boxes from whole keys, so loading it is shardkeep's own
load (``load_formats.load_dcp``): matching, casts, errors and
load-and-broadcast.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import os
import warnings
from typing import Any, Iterator

import ml_dtypes
import numpy as np

from .. import _core
from ..base import dtypes, tree_codec
from .. import options as options_lib
from ..errors import CorruptionError, InvalidArgumentError, NotFoundError
from ..loading.load_source import Source, Span, destination
from ..loading.other_formats import DCP_METADATA_FILE
from .optional import require

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
_MAX_READ_THREADS = 8


class DcpSource(Source):
    """A DCP checkpoint as a load's source; keys are read whole, on up to
    ``options.io_threads`` threads. Its default (0) means one per core
    here too, but at most 8 where the engine takes up to 16: each of these
    threads holds a whole key in memory, the engine's a chunk or a range."""

    reads_whole_leaves = True  # see Source

    def __init__(self, path, *, allow_pickle: bool, options: options_lib.Options):
        if not allow_pickle:
            raise InvalidArgumentError(f"DCP checkpoint {os.fspath(path)}: {PICKLE_REFUSAL}")
        self._torch = require("torch", "dcp", "reading PyTorch DCP checkpoints")
        self._dcp = require("torch.distributed.checkpoint", "dcp",
                            "reading PyTorch DCP checkpoints")
        self.directory = os.path.abspath(os.fspath(path))
        self.where = f"DCP checkpoint {self.directory}"
        self._threads = options.io_threads or min(_MAX_READ_THREADS, os.cpu_count() or 1)
        self._allow_lossy = options.allow_lossy_cast
        self._metadata = self._read_metadata()
        items = self._metadata.state_dict_metadata
        with quiet():
            values = self._python_values([fqn for fqn, item in items.items()
                                          if not hasattr(item, "size")])
        self._leaf_keys: list[tuple] = []  # per leaf: (fqn, where, torch dtype)
        entries = [(self._keys(fqn), self._describe(fqn, item, values))
                   for fqn, item in items.items()]
        tree = _core.tree_of_keys(self.where, [(keys, _core.KeyedValue.LEAF)
                                               for keys, _ in entries])
        self._meta = _core.PytreeInfo(tree, [leaf for _, leaf in entries])
        self._leaves = self._meta.leaves

    def meta(self) -> _core.PytreeInfo:
        return self._meta

    def read(self, requests: list[_core.ReadRequest]) -> None:
        """Reads each key that requests name once, whole, then copies
        (casting by the core's rules) every requested box out of it. At
        most one key per thread is read ahead of the copies, so memory
        holds that many keys, not all of them."""
        by_leaf: dict[int, list[_core.ReadRequest]] = {}
        for request in requests:
            _core.check_cast(self._leaves[request.leaf].dtype, request.dtype,
                             self._allow_lossy, self._leaf_keys[request.leaf][1])
            by_leaf.setdefault(request.leaf, []).append(request)
        reading: collections.deque = collections.deque()
        with concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="shardkeep-dcp") as pool, quiet():
            for number, leaf_requests in by_leaf.items():
                into = self._whole_leaf(number, leaf_requests)
                if into is not None:  # read straight into the one request's buffer
                    reading.append((pool.submit(self._read_whole, number, into), []))
                else:
                    reading.append((pool.submit(self._read_whole, number), leaf_requests))
                if len(reading) >= self._threads:
                    _copy_boxes(*reading.popleft())
            while reading:
                _copy_boxes(*reading.popleft())

    def ranges(self, requests: list[_core.ReadRequest]) -> list[list[Span]]:
        """A key is read whole: every box of it reads all of it."""
        return [[Span(self._leaf_keys[request.leaf][0], 0, 1)] for request in requests]

    def _whole_leaf(self, number: int, requests: list[_core.ReadRequest]) -> np.ndarray | None:
        """The buffer of ``requests`` as leaf ``number``'s array when they
        are one request for all of it in its stored dtype (conversion's
        reads, a load onto the saved layout of a single device), else None."""
        leaf = self._leaves[number]
        if len(requests) != 1:
            return None
        request, shape = requests[0], tuple(leaf.shape)
        if (request.dtype != leaf.dtype or tuple(request.shape) != shape
                or any(request.origin)):
            return None
        return destination(request).view(dtypes.from_name(leaf.dtype)).reshape(shape)

    def _read_metadata(self):
        file = os.path.join(self.directory, DCP_METADATA_FILE)
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

    def _describe(self, fqn: str, item, values: dict[str, Any]) -> _core.LeafInfo:
        """The meta.json description of key ``fqn``."""
        path = _core.key_path([name for name, _ in self._keys(fqn)])
        where = f"{self.where}: key {fqn!r} (leaf {path!r})"
        self._leaf_keys.append((fqn, where, getattr(getattr(item, "properties", None),
                                                    "dtype", None)))
        if fqn in values:
            value = values[fqn]
            if value is None:
                return _core.LeafInfo(path, _core.LeafKind.NONE)
            if isinstance(value, (bool, int, float, str)):
                return tree_codec.value_leaf(path, value)
            raise InvalidArgumentError(
                f"{where}: holds a {type(value).__name__}; shardkeep stores Python values"
                " only of types bool, int, float, str and None")
        torch_dtype = str(item.properties.dtype).removeprefix("torch.")
        if torch_dtype in _VIEWED:
            dtype = np.dtype(_VIEWED[torch_dtype])
        elif torch_dtype in _NATIVE:
            dtype = np.dtype(torch_dtype)
        else:
            raise InvalidArgumentError(f"{where}: torch dtype {torch_dtype} has no numpy form")
        return _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(dtype),
                              [int(n) for n in item.size])

    def _keys(self, fqn: str):
        """The leaf's keys: DCP's record of the nested state dict (ints are
        list positions), or the FQN itself as one dict key."""
        original = (getattr(self._metadata, "planner_data", None) or {}).get(fqn)
        if not original:
            return [(fqn, False)]
        return [(str(k), isinstance(k, int)) for k in original]

    def _read_whole(self, number: int, into: np.ndarray | None = None) -> np.ndarray:
        """Leaf ``number`` as stored, read into ``into`` (its shape and
        dtype) or a new array."""
        fqn, where, torch_dtype = self._leaf_keys[number]
        leaf = self._leaves[number]
        dtype = dtypes.from_name(leaf.dtype)
        array = into if into is not None else np.empty(leaf.shape, dtype)
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


def _copy_boxes(whole_read: concurrent.futures.Future,
                requests: list[_core.ReadRequest]) -> None:
    """Copies each request's box out of the whole key being read (none
    when the key was read straight into its request's buffer)."""
    whole = whole_read.result()
    for request in requests:
        shape, dst = request.shape, destination(request)
        box = whole[tuple(slice(o, o + n) for o, n in zip(request.origin, shape))]
        if request.dtype == dtypes.name_of(whole.dtype):
            np.copyto(dst.view(whole.dtype).reshape(shape), box)
        else:
            _core.cast(dtypes.as_bytes(np.ascontiguousarray(box)), dtypes.name_of(whole.dtype),
                       dst, request.dtype)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """DCP warns on every load outside a process group, which is how each
    key is read here on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process",
                                category=UserWarning)
        yield


@functools.cache
def _reader_class(dcp):
    """FileSystemReader handing out metadata already read, so that loading
    key after key does not unpickle ``.metadata`` again each time."""

    # A base class from a module imported at run time (torch is optional).
    class KnownMetadataReader(dcp.FileSystemReader):  # type: ignore[name-defined]
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
