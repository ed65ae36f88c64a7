"""Pytree <-> (structure JSON, leaves) encoding for meta.json.

The structure keeps what a load without a target needs to rebuild plain
Python containers: dict key order, lists, tuples, named tuples (name and
fields) and other registered pytree nodes (rebuilt as dicts). ``None`` is a
leaf here, unlike in ``jax.tree_util``, so that it round-trips.

Leaves are named by their key path (``_core.key_path``: the keys joined
by "/", with "~" escaped as "~0" and "/" as "~1", as in JSON Pointer), so
that any dict key maps to a unique, reversible path segment. The core
writes and reads that escaping; nothing here spells it.
"""

from __future__ import annotations

import collections
import dataclasses
import keyword
import math
import re
from typing import Any, Sequence

import jax

from .. import _core
from ..errors import InvalidArgumentError

_tu = jax.tree_util
_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict)


def _flatten_one_level_with_keys_compat(node) -> tuple[list, Any]:
    """``jax.tree_util.flatten_one_level_with_keys`` for the JAX releases
    without it (before 0.7; the newest for Python 3.10 is 0.6.2): the
    node's children with their keys, each child taken as a leaf; a
    ValueError when ``node`` is not a registered pytree node."""
    children, treedef = _tu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if _tu.treedef_is_leaf(treedef):
        raise ValueError(f"{type(node).__name__} is a leaf, not a pytree node")
    return [(path[0], child) for path, child in children], treedef


_flatten_one_level_with_keys = getattr(_tu, "flatten_one_level_with_keys",
                                       _flatten_one_level_with_keys_compat)


@dataclasses.dataclass
class Leaf:
    """One leaf found by ``flatten``: its escaped key path and its value."""

    path: str
    value: Any


def key_str(key) -> str:
    """The unescaped string of one ``jax.tree_util`` key entry."""
    if isinstance(key, _tu.DictKey):
        return str(key.key)
    if isinstance(key, _tu.SequenceKey):
        return str(key.idx)
    if isinstance(key, _tu.GetAttrKey):
        return key.name
    if isinstance(key, _tu.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def path_str(keys: Sequence) -> str:
    """The escaped leaf path of a ``jax.tree_util`` key path."""
    return _core.key_path([key_str(k) for k in keys])


def flatten(tree) -> tuple[dict, list[Leaf]]:
    """Returns (structure, leaves) of ``tree``; leaves in structure order.

    Raises InvalidArgumentError for dict keys that are neither str nor int
    and for two leaves whose escaped paths collide (e.g. keys 1 and "1").
    """
    leaves: list[Leaf] = []
    structure = _encode(tree, (), leaves)
    seen: dict[str, int] = {}
    for leaf in leaves:
        if leaf.path in seen:
            raise InvalidArgumentError(
                f"two leaves share the key path {leaf.path!r}; rename one of their keys")
        seen[leaf.path] = 1
    return structure, leaves


def _encode(node, keys: tuple[str, ...], leaves: list[Leaf]) -> dict:
    if isinstance(node, _DICT_TYPES):
        dict_keys = list(node.keys())
        for k in dict_keys:
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise InvalidArgumentError(
                    f"dict key {k!r} at {_core.key_path(keys) or '<root>'!r} is a "
                    f"{type(k).__name__}; only str and int keys can be saved")
        children = [_encode(node[k], keys + (str(k),), leaves) for k in dict_keys]
        return {"type": "dict", "keys": dict_keys, "children": children}
    if type(node) in (list, tuple):
        children = [_encode(v, keys + (str(i),), leaves) for i, v in enumerate(node)]
        return {"type": type(node).__name__, "children": children}
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        fields = list(node._fields)
        children = [_encode(v, keys + (f,), leaves) for f, v in zip(fields, node)]
        return {"type": "namedtuple", "name": _qualname(type(node)), "fields": fields,
                "children": children}
    if node is not None:
        try:
            key_children, _ = _flatten_one_level_with_keys(node)
        except ValueError:  # Not a registered pytree node: a leaf.
            key_children = None
        if key_children is not None:
            child_keys = [key_str(k) for k, _ in key_children]
            children = [_encode(v, keys + (k,), leaves)
                        for k, (_, v) in zip(child_keys, key_children)]
            return {"type": "custom", "name": _qualname(type(node)), "keys": child_keys,
                    "children": children}
    leaves.append(Leaf(_core.key_path(keys), node))
    return {"type": "leaf", "leaf": len(leaves) - 1}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def rebuild(structure: dict, values: Sequence) -> Any:
    """Rebuilds plain containers from ``structure`` with ``values`` as leaves.

    Named tuples come back as ``collections.namedtuple`` classes with the
    saved name and fields; other registered nodes come back as dicts keyed
    by their key strings.
    """
    kind = structure["type"]
    if kind == "leaf":
        return values[structure["leaf"]]
    children = [rebuild(c, values) for c in structure["children"]]
    if kind == "dict":
        return dict(zip(structure["keys"], children))
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    if kind == "namedtuple":
        return _namedtuple_class(structure["name"], tuple(structure["fields"]))(*children)
    if kind == "custom":
        return dict(zip(structure["keys"], children))
    raise InvalidArgumentError(f"unknown tree node type {kind!r} in meta.json")


_namedtuple_classes: dict[tuple[str, tuple[str, ...]], type] = {}


def _namedtuple_class(name: str, fields: tuple[str, ...]) -> type:
    # One class per (name, fields) so that rebuilt values compare and
    # tree-map like the originals: equal structures share a treedef.
    known = _namedtuple_classes.get((name, fields))
    if known is not None:
        return known
    type_name = re.sub(r"\W", "_", name.rsplit(".", 1)[-1]) or "Record"
    if keyword.iskeyword(type_name) or type_name[0].isdigit():
        type_name = "_" + type_name
    # The class's name is known at run time only, which mypy does not model.
    cls = collections.namedtuple(type_name, fields, rename=True)  # type: ignore[misc]
    _namedtuple_classes[(name, fields)] = cls
    return cls


def value_leaf(path: str, value: bool | int | float | str) -> _core.LeafInfo:
    """The meta.json entry of a bool, int, float or str leaf, with its value."""
    if isinstance(value, str):
        return _core.LeafInfo(path, _core.LeafKind.STRING, value=value)
    encoded: bool | int | float | str
    if isinstance(value, bool):
        dtype, encoded = "bool", value
    elif isinstance(value, int):
        if not -2**63 <= value < 2**63:
            raise InvalidArgumentError(f"int leaf {path!r} = {value} does not fit in int64")
        dtype, encoded = "int64", value
    else:
        dtype = "float64"
        # JSON has no non-finite numbers: they are saved as strings.
        encoded = ("nan" if math.isnan(value) else
                   ("inf" if value > 0 else "-inf") if math.isinf(value) else value)
    return _core.LeafInfo(path, _core.LeafKind.SCALAR, dtype, [], value=encoded)
