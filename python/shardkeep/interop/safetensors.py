"""Loading safetensors files (Hugging Face) onto any sharding.

The core opens a ``.safetensors`` file, a folder of them or a
``model.safetensors.index.json`` as a checkpoint with one pytree
checkpointable whose leaves are the tensors, each stored as one raw chunk
(see docs/INTEROP.md). Loading is then shardkeep's own load: each
process reads only the byte ranges of the boxes its devices hold, straight
into the destination buffers, with casts and file mapping. This module
only maps key paths to tensor names; the core reader is its source
(``load_source.CoreSource``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, cast

import jax
import numpy as np

from .. import _core
from ..base import dtypes, events, tree_codec
from ..loading import load_executor
from .. import options as options_lib
from ..base.array_source import ArraySource
from ..errors import CorruptionError, IncompatibleError, InvalidArgumentError
from ..loading.load_source import CoreSource

# The core's name for the one checkpointable of a safetensors source.
_TENSORS = "tensors"

KeyMap = Callable[[str], str] | Mapping[str, str]


def load_safetensors(path, target: Any = None, *, key_map: KeyMap | None = None,
                     partial: bool = True, options: options_lib.Options | None = None) -> Any:
    """Loads tensors from safetensors files onto ``target``'s shardings.

    ``path``: a ``.safetensors`` file, a folder holding them, or a
    ``model.safetensors.index.json`` (Hugging Face's sharded layout); local
    or ``s3://``.

    With a ``target`` (a pytree of ``jax.ShapeDtypeStruct`` with
    shardings, arrays or numpy arrays, as for ``shardkeep.load``), each
    target leaf is filled from one tensor. By default the tensor's name is
    the leaf's key path with its keys joined by ``"."``: the leaf
    ``["model"]["layers"][0]["weight"]`` reads ``model.layers.0.weight``.
    ``key_map`` replaces that: a mapping or a function from a leaf's key
    path (keys joined by ``"/"``, as ``shardkeep.metadata`` names leaves)
    to a tensor name. A target leaf whose tensor is missing raises
    IncompatibleError, and so does a shape that differs. A dtype that
    differs is cast (lossy casts need ``Options(allow_lossy_cast=True)``).

    ``partial`` is that of ``shardkeep.load``, with the other default:
    True loads the tensors the target names and reads no others (files
    commonly hold more tensors than one model takes: a head, tied or
    unused weights); False also checks that the target names every tensor
    in the files, raising IncompatibleError naming those it leaves out.

    Without a target every tensor is loaded as a numpy array into nested
    dicts, its name split at ``"."`` (``{"model": {"layers": {"0": ...}}}``).
    """
    path = os.fspath(path)
    with events.loading(path) as report:
        return report.loaded(_load(path, target, key_map, partial, options_lib.resolve(options)))


def _load(path: str, target: Any, key_map: KeyMap | None, partial: bool,
          options: options_lib.Options) -> Any:
    core_options = options.to_core()
    reader = _core.open_safetensors(path, core_options)
    map_files = options.map_files and _core.Location(path).local_path is not None
    meta = reader.pytree(_TENSORS)
    names = [_core.unescape_key(leaf.path) for leaf in meta.leaves]
    if target is None:
        meta = _core.PytreeInfo(_nested_dicts(path, names), meta.leaves)
    else:
        meta = _renamed_for(path, meta, names, target, key_map, partial)
    source = CoreSource(reader, _TENSORS, path, core_options, map_files=map_files, meta=meta)
    return load_executor.load_with(source, target, path=path, partial=True, options=options)


def _renamed_for(path: str, meta: _core.PytreeInfo, names: list[str], target: Any,
                 key_map: KeyMap | None, partial: bool) -> _core.PytreeInfo:
    """``meta`` with each tensor wanted by ``target`` named by its leaf's key
    path, so that the planner matches them; other tensors keep names no key
    path can take (and are an error unless ``partial``)."""
    keyed, _ = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is None)
    number = {name: i for i, name in enumerate(names)}
    leaves = meta.leaves
    for leaf in leaves:
        leaf.path = "\0" + leaf.path
    missing = []
    for keys, _ in keyed:
        key_path = tree_codec.path_str(keys)
        tensor = _tensor_name(keys, key_path, key_map)
        if tensor not in number:
            missing.append(f"{key_path!r} (tensor {tensor!r})")
            continue
        leaves[number[tensor]].path = key_path
    if missing:
        raise IncompatibleError(f"{path}: target leaves without a tensor: {_shown(missing)}")
    unnamed = [repr(name) for name, leaf in zip(names, leaves) if leaf.path.startswith("\0")]
    if unnamed and not partial:
        raise IncompatibleError(f"{path}: tensors the target does not name: {_shown(unnamed)}"
                                " (partial=False; the default, partial=True, loads a subset)")
    return _core.PytreeInfo(meta.tree, leaves)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")


def _tensor_name(keys, key_path: str, key_map: KeyMap | None) -> str:
    if key_map is None:
        return ".".join(tree_codec.key_str(k) for k in keys)
    if callable(key_map):
        return key_map(key_path)
    try:
        return key_map[key_path]
    except KeyError:
        raise InvalidArgumentError(f"key_map has no tensor name for the leaf {key_path!r}") from None


def _nested_dicts(path: str, names: list[str]) -> dict:
    """The tree of nested dicts holding tensor i at its name's ``"."`` parts
    (dict keys all: "0" stays a string)."""
    try:
        tree = _core.tree_of_keys(path, [([(part, False) for part in name.split(".")],
                                          _core.KeyedValue.LEAF) for name in names])
    except CorruptionError as e:  # the names, not the files, do not nest
        raise InvalidArgumentError(f"{e}; pass a target to name the tensors' places") from None
    return cast(dict, tree)  # every key is a name: the root is a dict


def safetensors_sources(path, *, options: options_lib.Options | None = None) -> Any:
    """The tensors of safetensors files as a tree of ``ArraySource`` leaves
    (nested dicts by the names' ``"."`` parts, as ``load_safetensors``
    without a target gives them): saving it converts the files to a
    shardkeep checkpoint chunk by chunk, never holding the model."""
    path = os.fspath(path)
    core_options = options_lib.resolve(options).to_core()
    reader = _core.open_safetensors(path, core_options)
    leaves = reader.pytree(_TENSORS).leaves
    names = [_core.unescape_key(leaf.path) for leaf in leaves]
    sources = [_source_of(reader, number, leaf, core_options)
               for number, leaf in enumerate(leaves)]
    return tree_codec.rebuild(_nested_dicts(path, names), sources)


def _source_of(reader, number: int, leaf: _core.LeafInfo, core_options) -> ArraySource:
    dtype = dtypes.from_name(leaf.dtype)

    def read(origin, shape):
        out = np.empty(shape, dtype)
        reader.read(_TENSORS, [_core.ReadRequest(number, leaf.dtype, origin, shape,
                                                 dtypes.as_bytes(out))], core_options)
        return out

    return ArraySource(tuple(leaf.shape), dtype, read)
