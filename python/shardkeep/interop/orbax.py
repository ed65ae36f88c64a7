"""Orbax checkpoints, read through tensorstore.

What orbax-checkpoint writes (checked against 0.12.8), for one pytree item:

* ``_METADATA``: JSON; ``tree_metadata`` maps each leaf to its keys
  (``key_metadata``: ``key`` and ``key_type``, 1 for a sequence position,
  2 for a dict key) and its ``value_type`` ("jax.Array", "np.ndarray",
  "scalar", "string", "None", and "Dict"/"List" for empty containers);
  ``use_ocdbt`` and ``use_zarr3`` say how arrays are stored.
* Each array is a zarr array (``.zarray`` for zarr v2, ``zarr.json`` for
  zarr v3) named by its keys joined with '.' (the "param name"): in an
  OCDBT database rooted at the item folder (``manifest.ocdbt``; the
  per-process ``ocdbt.process_<i>`` databases are merged into it at
  commit), or with ``use_ocdbt`` false, as plain folders of chunk files.
  Python scalars are zarr arrays of shape ().
* ``_strings.json``: the string leaves, by param name.
* ``array_metadatas/process_<i>``: JSON, per saving process, a list of
  ``array_metadata`` records (``param_name``, ``ext_metadata``); a typed
  PRNG key array is stored as its uint32 key data with
  ``ext_metadata.random_key_impl`` naming its implementation.

An item folder is where ``StandardCheckpointer`` / ``PyTreeCheckpointer``
saved, ``<step>/<item>`` in a ``CheckpointManager`` directory (``default``
for a single unnamed item), and ``<path>/<name>`` for the v1 API's
``save`` / ``save_pytree`` (``state``) and ``save_checkpointables``.

The JSON files are read by shardkeep (``shardkeep.interop.orbax_folders``);
the arrays (OCDBT B-trees, zarr codecs, chunks) only through tensorstore,
the library that defines them.
``OrbaxSource`` describes an item as meta.json would and reads boxes of
its arrays, so that loading one is shardkeep's own load (``load_formats``):
the same matching, casts, typed keys, errors and load-and-broadcast.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from .. import _core
from ..base import dtypes, tree_codec
from .. import options as options_lib
from ..errors import CorruptionError, IncompatibleError, InvalidArgumentError, NotFoundError
from ..loading.load_source import Source, Span, destination
from ..loading.other_formats import (ORBAX_ITEM_MARKER, ORBAX_STEP_MARKER, orbax_steps,
                                     root_hint, step_of_folder)
from .optional import require
from .orbax_folders import custom_metadata, read_json

_STRINGS_FILE = "_strings.json"
_ARRAY_METADATAS = "array_metadatas"
_KEY_IMPL = "random_key_impl"
_UNCOMMITTED = ".orbax-checkpoint-tmp"
_ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar")
_EMPTY_CONTAINERS = {"Dict": _core.KeyedValue.EMPTY_DICT, "List": _core.KeyedValue.EMPTY_LIST}
_SEQUENCE_KEY = 1


class OrbaxSource(Source):
    """An Orbax pytree item as a load's source: its leaves described as
    meta.json would (Python scalars read when opened), its arrays opened
    (in parallel) and read box by box through tensorstore."""

    def __init__(self, path, options: options_lib.Options):
        ts = require("tensorstore", "orbax", "reading Orbax checkpoints")
        self.directory = find_item_folder(os.path.abspath(os.fspath(path)))
        self.where = f"Orbax checkpoint {self.directory}"
        self._ts = ts
        self._allow_lossy = options.allow_lossy_cast
        metadata = read_json(self.directory, ORBAX_ITEM_MARKER)
        entries = _tree_entries(self.directory, metadata)
        strings = (read_json(self.directory, _STRINGS_FILE)
                   if any(e["value_type"] == "string" for e in entries) else {})
        key_impls = _key_impls(self.directory)
        opener = _ArrayOpener(ts, self.directory, metadata, options)
        opening = [opener.open(e["param"]) if e["value_type"] in _ARRAY_TYPES else None
                   for e in entries]
        self._stores: list = []  # per leaf number: its tensorstore, or None
        self._names: list[str] = []  # per leaf number: how errors name it
        leaves = []
        for entry, opened in zip(entries, opening):
            if entry["value_type"] not in _EMPTY_CONTAINERS:  # those are tree nodes
                leaves.append(self._describe(entry, opened, strings, key_impls))
        tree = _core.tree_of_keys(self.where, [
            (e["keys"], _EMPTY_CONTAINERS.get(e["value_type"], _core.KeyedValue.LEAF))
            for e in entries])
        self._meta = _core.PytreeInfo(tree, leaves)

    def meta(self) -> _core.PytreeInfo:
        return self._meta

    @property
    def step(self) -> int | None:
        """The step of the ``CheckpointManager`` step folder the item sits
        in, None for an item saved elsewhere."""
        return step_of_folder(os.path.dirname(self.directory))

    @property
    def custom_metadata(self) -> dict:
        """The custom metadata Orbax saved with the item: that of the
        ``_CHECKPOINT_METADATA`` beside it (a checkpointer's save of one
        item) or in the folder above (a manager's step, a composite save)."""
        for folder in (self.directory, os.path.dirname(self.directory)):
            if os.path.isfile(os.path.join(folder, ORBAX_STEP_MARKER)):
                return custom_metadata(folder)
        return {}

    def _describe(self, entry: dict, opened, strings: dict, key_impls: dict) -> _core.LeafInfo:
        keys, param, value_type = entry["keys"], entry["param"], entry["value_type"]
        path = _key_path(keys)
        where = f"{self.where}: leaf {path!r} (array {param!r})"
        store = None
        if value_type == "string":
            if not isinstance(strings, dict) or not isinstance(strings.get(param), str):
                raise NotFoundError(f"{self.where}: string leaf {path!r} is not"
                                    f" in {_STRINGS_FILE} under {param!r}")
            leaf = tree_codec.value_leaf(path, strings[param])
        elif value_type == "None":
            leaf = _core.LeafInfo(path, _core.LeafKind.NONE)
        else:
            store = _result(opened, where)
            if any(m != 0 for m in store.domain.inclusive_min):
                raise IncompatibleError(f"{where}: its domain {store.domain} does not start at 0")
            dtype = np.dtype(store.dtype.numpy_dtype)
            if value_type == "scalar":
                value = _result(store.read(), where)[()].item()
                leaf = tree_codec.value_leaf(path, value)
                store = None
            else:
                leaf = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(dtype),
                                      list(store.shape), prng_impl=key_impls.get(param, ""))
        self._stores.append(store)
        self._names.append(where)
        return leaf

    def read(self, requests: list[_core.ReadRequest]) -> None:
        """Every box read at once by tensorstore, straight into its buffer
        when the dtype is the stored one, else into a temporary array cast
        by the core."""
        for request in requests:
            store = self._stores[request.leaf]
            _core.check_cast(dtypes.name_of(np.dtype(store.dtype.numpy_dtype)), request.dtype,
                             self._allow_lossy, self._names[request.leaf])
        pending = []
        for request in requests:
            number, dtype_name, origin, shape = (request.leaf, request.dtype, request.origin,
                                                 request.shape)
            dst = destination(request)
            store = self._stores[number]
            stored = np.dtype(store.dtype.numpy_dtype)
            out = (dst.view(stored).reshape(shape) if dtype_name == dtypes.name_of(stored)
                   else np.empty(shape, stored))
            index = tuple(slice(o, o + n) for o, n in zip(origin, shape))
            box = store[index] if index else store
            # Written by tensorstore straight into the array handed out,
            # chunk by chunk, as Orbax itself reads: no intermediate copy.
            pending.append((self._ts.array(out).write(box), out, number, origin, shape,
                            dtype_name, dst))
        for future, out, number, origin, shape, dtype_name, dst in pending:
            _result(future, f"{self._names[number]}, box origin {tuple(origin)} extent"
                            f" {tuple(shape)}")
            if dtype_name != dtypes.name_of(out.dtype):
                _core.cast(dtypes.as_bytes(out), dtypes.name_of(out.dtype), dst, dtype_name)

    def ranges(self, requests: list[_core.ReadRequest]) -> list[list[Span]]:
        """The rows of stored chunks each box reads, as (array, first chunk
        row, last + 1): boxes that load-and-broadcast cuts differ in their
        first dimension only, so these tell whether two pieces would read
        one chunk."""
        out: list[list[Span]] = []
        for request in requests:
            number, origin, shape = request.leaf, request.origin, request.shape
            store = self._stores[number]
            if not shape:
                out.append([Span(self._names[number], 0, 1)])
                continue
            rows = store.chunk_layout.read_chunk.shape[0] or 1
            first = origin[0] // rows
            last = (origin[0] + max(shape[0], 1) - 1) // rows
            out.append([Span(self._names[number], first, last + 1)])
        return out


# The meta.json dtype of a Python scalar, by the type Orbax stored it as.


def _key_impls(directory: str) -> dict[str, str]:
    """The PRNG implementation of each typed-key array, by param name, from
    ``array_metadatas`` (absent before orbax-checkpoint recorded it)."""
    folder = os.path.join(directory, _ARRAY_METADATAS)
    if not os.path.isdir(folder):
        return {}
    impls = {}
    for name in sorted(os.listdir(folder)):
        records = read_json(folder, name)
        try:
            for record in records["array_metadatas"]:
                metadata = record["array_metadata"]
                impl = (metadata.get("ext_metadata") or {}).get(_KEY_IMPL)
                if impl is not None:
                    impls[metadata["param_name"]] = impl
        except (KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(f"Orbax checkpoint {directory}: {_ARRAY_METADATAS}/{name}"
                                  f" is not a list of array metadata ({e!r})") from e
    return impls


def find_item_folder(path: str) -> str:
    """``path`` if it holds ``_METADATA``, else its only subfolder that does."""
    if _UNCOMMITTED in os.path.basename(path.rstrip(os.sep)):
        raise NotFoundError(f"{path} is an Orbax save that never committed (its folder name"
                            f" has {_UNCOMMITTED!r})")
    if os.path.isfile(os.path.join(path, ORBAX_ITEM_MARKER)):
        return path
    if not os.path.isdir(path):
        raise NotFoundError(f"no Orbax checkpoint at {path}: no such folder")
    children = sorted(os.listdir(path))
    items = [c for c in children if os.path.isfile(os.path.join(path, c, ORBAX_ITEM_MARKER))]
    if len(items) == 1:
        return os.path.join(path, items[0])
    if items:
        raise InvalidArgumentError(
            f"{path} holds several Orbax items ({', '.join(items)}); pass the folder of one,"
            f" e.g. {os.path.join(path, items[0])}")
    steps = orbax_steps(path)
    if steps:
        raise InvalidArgumentError(root_hint(path, steps, "not one checkpoint"))
    raise NotFoundError(f"no Orbax checkpoint at {path}: neither it nor a subfolder has"
                        f" {ORBAX_ITEM_MARKER}")


def _tree_entries(directory: str, meta: Any) -> list[dict]:
    """(keys, param name, value type) of each leaf in ``_METADATA``."""
    where = f"Orbax checkpoint {directory}: {ORBAX_ITEM_MARKER}"
    tree = meta.get("tree_metadata") if isinstance(meta, dict) else None
    if not isinstance(tree, dict):
        raise CorruptionError(f"{where} has no tree_metadata object (not written by"
                              " orbax-checkpoint 0.5 or later?)")
    entries = []
    for name, leaf in tree.items():
        try:
            keys = [(str(k["key"]), k["key_type"] == _SEQUENCE_KEY) for k in leaf["key_metadata"]]
            value_type = leaf["value_metadata"]["value_type"]
        except (KeyError, TypeError) as e:
            raise CorruptionError(f"{where}: leaf {name} lacks key_metadata or"
                                  f" value_metadata.value_type ({e!r})") from e
        if value_type not in _ARRAY_TYPES and value_type not in ("string", "None") \
                and value_type not in _EMPTY_CONTAINERS:
            raise IncompatibleError(f"{where}: leaf {_key_path(keys)!r} has value_type"
                                    f" {value_type!r}, which shardkeep cannot read")
        entries.append({"keys": keys, "param": ".".join(k for k, _ in keys),
                        "value_type": value_type})
    return entries


def _key_path(keys: list[tuple[str, bool]]) -> str:
    """The shardkeep key path of a leaf's (name, is a list position) keys."""
    return _core.key_path([name for name, _ in keys])


class _ArrayOpener:
    """Opens arrays with the tensorstore spec Orbax reads them with, all
    sharing one context (so one OCDBT manifest and B-tree cache)."""

    def __init__(self, ts, directory: str, meta: dict, options: options_lib.Options):
        self._ts = ts
        self._directory = directory
        self._use_ocdbt = bool(meta.get("use_ocdbt", False))
        self._driver = "zarr3" if meta.get("use_zarr3", False) else "zarr"
        context: dict = {"cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}}
        if options.io_threads:
            context["file_io_concurrency"] = {"limit": options.io_threads}
            context["data_copy_concurrency"] = {"limit": options.io_threads}
        self._context = ts.Context(context)

    def open(self, param: str):
        if self._use_ocdbt:
            kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": self._directory + "/"},
                       "path": param, "cache_pool": "cache_pool#ocdbt"}
        else:
            kvstore = {"driver": "file", "path": os.path.join(self._directory, param)}
        spec = {"driver": self._driver, "kvstore": kvstore,
                "recheck_cached_data": False, "recheck_cached_metadata": False,
                # A missing chunk is an error, not zeros: Orbax writes every chunk.
                "fill_missing_data_reads": False}
        return self._ts.open(spec, open=True, read=True, context=self._context)


def _result(future, where: str):
    """A tensorstore future's value; its errors as shardkeep's, naming ``where``."""
    try:
        return future.result()
    except ValueError as e:  # tensorstore reports a failed Status as ValueError
        message = re.sub(r"\s*\[tensorstore_spec=.*\]\s*$", "", str(e), flags=re.S)
        if message.startswith("NOT_FOUND"):
            raise NotFoundError(f"{where}: {message}") from e
        raise CorruptionError(f"{where}: {message}") from e
