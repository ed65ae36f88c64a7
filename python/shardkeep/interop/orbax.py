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

An item folder is where ``StandardCheckpointer`` / ``PyTreeCheckpointer``
saved, ``<step>/<item>`` in a ``CheckpointManager`` directory (``default``
for a single unnamed item), and ``<path>/<name>`` for the v1 API's
``save`` / ``save_pytree`` (``state``) and ``save_checkpointables``.

The JSON files are read here; the arrays (OCDBT B-trees, zarr codecs,
chunks) only through tensorstore, the library that defines them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from .. import options as options_lib
from ..errors import CorruptionError, IncompatibleError, InvalidArgumentError, NotFoundError
from . import placement
from .optional import require
from .source import SourceLeaf
from .tree_build import EMPTY_DICT, EMPTY_LIST, key_path

_ITEM_MARKER = "_METADATA"
_STRINGS_FILE = "_strings.json"
_UNCOMMITTED = ".orbax-checkpoint-tmp"
_ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar")
_PLAIN_VALUES = {"None": None, "Dict": EMPTY_DICT, "List": EMPTY_LIST}
_SEQUENCE_KEY = 1


def load_orbax(path, target: Any = None, *, options: options_lib.Options | None = None) -> Any:
    """Loads an Orbax checkpoint's pytree onto ``target``.

    ``path`` is the folder Orbax saved the pytree to (``_METADATA`` in
    it), or a folder holding exactly one such item (a ``CheckpointManager``
    step, or a v1 ``save`` path). ``target`` follows
    ``shardkeep.load``: ``jax.ShapeDtypeStruct`` leaves with shardings give
    ``jax.Array``s of those shardings, each process reading from storage
    only the boxes its devices hold (each distinct box once); numpy or
    Python leaves give numpy or Python values; None (whole or per leaf) the
    saved shapes and dtypes on the host (numpy arrays, Python scalars and
    strings), with nested dicts and lists rebuilt from Orbax's tree
    metadata. Leaves are matched by shardkeep key path (keys joined by '/',
    see docs/FORMAT.md §4.2); a target must name exactly the saved leaves.

    A target dtype other than the saved one is a cast, with the rules of
    ``shardkeep.load`` (lossy ones need ``Options(allow_lossy_cast=True)``);
    a shape other than the saved one raises IncompatibleError.
    ``options.io_threads`` bounds tensorstore's concurrent file reads and
    copies. Needs the ``tensorstore`` package (``shardkeep[orbax]``).
    """
    options = options_lib.resolve(options)
    item = open_item(path, options)
    return placement.load_all(item.where, item.leaves, target,
                              allow_lossy_cast=options.allow_lossy_cast)


class OrbaxItem:
    """An Orbax pytree item: its folder and its leaves, arrays opened."""

    def __init__(self, directory: str, leaves: list[SourceLeaf]):
        self.directory = directory
        self.where = f"Orbax checkpoint {directory}"
        self.leaves = leaves


def open_item(path, options: options_lib.Options) -> OrbaxItem:
    """Finds the item folder under ``path``, reads its metadata and opens
    every array (in parallel); reads no array data."""
    ts = require("tensorstore", "orbax", "reading Orbax checkpoints")
    directory = find_item_folder(os.path.abspath(os.fspath(path)))
    meta = _read_json(directory, _ITEM_MARKER)
    entries = _tree_entries(directory, meta)
    strings = (_read_json(directory, _STRINGS_FILE)
               if any(e["value_type"] == "string" for e in entries) else {})
    opener = _ArrayOpener(ts, directory, meta, options)
    pending = [(e, opener.open(e["param"]) if e["value_type"] in _ARRAY_TYPES else None)
               for e in entries]
    return OrbaxItem(directory, [_leaf(ts, directory, e, opened, strings)
                                   for e, opened in pending])


def find_item_folder(path: str) -> str:
    """``path`` if it holds ``_METADATA``, else its only subfolder that does."""
    if _UNCOMMITTED in os.path.basename(path.rstrip(os.sep)):
        raise NotFoundError(f"{path} is an Orbax save that never committed (its folder name"
                            f" has {_UNCOMMITTED!r})")
    if os.path.isfile(os.path.join(path, _ITEM_MARKER)):
        return path
    if not os.path.isdir(path):
        raise NotFoundError(f"no Orbax checkpoint at {path}: no such folder")
    children = sorted(os.listdir(path))
    items = [c for c in children if os.path.isfile(os.path.join(path, c, _ITEM_MARKER))]
    if len(items) == 1:
        return os.path.join(path, items[0])
    if items:
        raise InvalidArgumentError(
            f"{path} holds several Orbax items ({', '.join(items)}); pass the folder of one,"
            f" e.g. {os.path.join(path, items[0])}")
    steps = sorted((c for c in children if c.isdigit()), key=int)
    if steps:
        raise InvalidArgumentError(
            f"{path} looks like a CheckpointManager directory; pass one step's folder, e.g."
            f" {os.path.join(path, steps[-1])} (steps: {', '.join(steps)})")
    raise NotFoundError(f"no Orbax checkpoint at {path}: neither it nor a subfolder has"
                        f" {_ITEM_MARKER}")


def _read_json(directory: str, name: str) -> Any:
    file = os.path.join(directory, name)
    try:
        with open(file, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError as e:
        raise NotFoundError(f"Orbax checkpoint {directory}: {name} is missing") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"Orbax checkpoint {directory}: {name} is not valid JSON: {e}") from e


def _tree_entries(directory: str, meta: Any) -> list[dict]:
    """(keys, param name, value type) of each leaf in ``_METADATA``."""
    where = f"Orbax checkpoint {directory}: {_ITEM_MARKER}"
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
        if value_type not in _ARRAY_TYPES and value_type != "string" \
                and value_type not in _PLAIN_VALUES:
            raise IncompatibleError(f"{where}: leaf {key_path(keys)!r} has value_type"
                                    f" {value_type!r}, which shardkeep cannot read")
        entries.append({"keys": keys, "param": ".".join(k for k, _ in keys),
                        "value_type": value_type})
    return entries


def _leaf(ts, directory: str, entry: dict, opened, strings: dict) -> SourceLeaf:
    keys, param, value_type = entry["keys"], entry["param"], entry["value_type"]
    path = key_path(keys)
    where = f"Orbax checkpoint {directory}: leaf {path!r} (array {param!r})"
    if value_type == "string":
        if not isinstance(strings, dict) or not isinstance(strings.get(param), str):
            raise NotFoundError(f"Orbax checkpoint {directory}: string leaf {path!r} is not"
                                f" in {_STRINGS_FILE} under {param!r}")
        return SourceLeaf(keys, path, where, value=strings[param])
    if value_type in _PLAIN_VALUES:
        return SourceLeaf(keys, path, where, value=_PLAIN_VALUES[value_type])
    store = _result(opened, where)
    if any(m != 0 for m in store.domain.inclusive_min):
        raise IncompatibleError(f"{where}: its domain {store.domain} does not start at 0")

    dtype = np.dtype(store.dtype.numpy_dtype)

    def read_box(origin, extent, store=store):
        # Written by tensorstore straight into the array handed out, chunk
        # by chunk, as Orbax itself reads: no intermediate copy.
        out = np.empty(extent, dtype)
        index = tuple(slice(o, o + n) for o, n in zip(origin, extent))
        source = store[index] if index else store
        return _NamedRead(out, ts.array(out).write(source), where, origin, extent)

    return SourceLeaf(keys, path, where, shape=tuple(store.shape), dtype=dtype, read_box=read_box,
                      python_scalar=value_type == "scalar")


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


class _NamedRead:
    """A box being read into ``out``; a failure names the leaf and the box."""

    def __init__(self, out: np.ndarray, future, where: str, origin, extent):
        self._out, self._future, self._where = out, future, where
        self._box = (tuple(origin), tuple(extent))

    def result(self) -> np.ndarray:
        _result(self._future, f"{self._where}, box origin {self._box[0]} extent {self._box[1]}")
        return self._out


def _result(future, where: str):
    """A tensorstore future's value; its errors as shardkeep's, naming ``where``."""
    try:
        return future.result()
    except ValueError as e:  # tensorstore reports a failed Status as ValueError
        message = re.sub(r"\s*\[tensorstore_spec=.*\]\s*$", "", str(e), flags=re.S)
        if message.startswith("NOT_FOUND"):
            raise NotFoundError(f"{where}: {message}") from e
        raise CorruptionError(f"{where}: {message}") from e
