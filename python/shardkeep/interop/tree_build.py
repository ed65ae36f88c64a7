"""Nested dicts and lists rebuilt from leaves named by key tuples.

Other formats record a leaf's place as a tuple of keys, each key a dict key
or a list position; this module rebuilds the containers as the tree of a
meta.json description (``structure``), and names leaves the shardkeep way
(docs/FORMAT.md §4.2).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import CorruptionError
from ..base.tree_codec import escape

# A key of a key tuple: (name, True) is a list position (name is its decimal
# string), (name, False) a dict key.
Key = tuple[str, bool]

EMPTY_DICT = object()
EMPTY_LIST = object()


def key_path(keys: Sequence[Key]) -> str:
    """The shardkeep key path of a leaf: escaped keys joined by '/'."""
    return "/".join(escape(name) for name, _ in keys)


def structure(where: str, entries: Sequence[tuple[Sequence[Key], Any]]) -> dict:
    """The meta.json "tree" (``tree_codec``'s structure) of nested dicts and
    lists holding leaf number i at entry i's keys; an entry whose value is
    EMPTY_DICT / EMPTY_LIST is an empty container and takes no number.
    Raises as ``_nest`` does."""
    numbered, count = [], 0
    for keys, value in entries:
        if value is EMPTY_DICT or value is EMPTY_LIST:
            numbered.append((keys, value))
        else:
            numbered.append((keys, _LeafNumber(count)))
            count += 1
    return _encode(_nest(where, numbered))


class _LeafNumber:
    __slots__ = ("number",)

    def __init__(self, number: int):
        self.number = number


def _encode(node: Any) -> dict:
    if isinstance(node, _LeafNumber):
        return {"type": "leaf", "leaf": node.number}
    if isinstance(node, list):
        return {"type": "list", "children": [_encode(child) for child in node]}
    return {"type": "dict", "keys": list(node), "children": [_encode(c) for c in node.values()]}


def _nest(where: str, entries: Sequence[tuple[Sequence[Key], Any]]) -> Any:
    """The tree holding each entry's value at its keys.

    Dict keys keep the order of their first entry; list positions must run
    0..n-1. A value EMPTY_DICT / EMPTY_LIST stands for an empty container.
    Raises CorruptionError (prefixed with ``where``) when two entries claim
    the same place, a node is used both as a dict and as a list, or list
    positions have gaps.
    """
    root: dict = {}
    kinds: dict[int, bool] = {}  # id(node) -> is a list
    for keys, value in entries:
        if not keys:
            if len(entries) != 1:
                raise CorruptionError(f"{where}: a leaf at the root beside other leaves")
            return _finish_value(value)
        node, is_list = root, keys[0][1]
        kinds.setdefault(id(root), is_list)
        for depth, (name, as_list) in enumerate(keys):
            if kinds[id(node)] != as_list:
                raise CorruptionError(
                    f"{where}: {key_path(keys[:depth]) or '<root>'!r} is used both as a"
                    " list and as a dict")
            last = depth == len(keys) - 1
            if last:
                if name in node:
                    raise CorruptionError(f"{where}: two leaves at {key_path(keys)!r}")
                node[name] = _finish_value(value)
            else:
                child = node.get(name)
                if child is None:
                    child = node[name] = {}
                    kinds[id(child)] = keys[depth + 1][1]
                elif not isinstance(child, dict) or id(child) not in kinds:
                    raise CorruptionError(
                        f"{where}: {key_path(keys[:depth + 1])!r} is both a leaf and a node")
                node = child
    return _lists(where, root, kinds, ())


def _finish_value(value: Any) -> Any:
    if value is EMPTY_DICT:
        return {}
    if value is EMPTY_LIST:
        return []
    return value


def _lists(where: str, node: Any, kinds: dict[int, bool], keys: tuple) -> Any:
    """Turns the nodes built as dicts but used as lists into lists."""
    if not isinstance(node, dict) or id(node) not in kinds:
        return node
    children = {name: _lists(where, child, kinds, keys + (name,))
                for name, child in node.items()}
    if not kinds[id(node)]:
        return children
    positions = sorted(children, key=lambda name: int(name) if name.isdigit() else -1)
    if positions != [str(i) for i in range(len(positions))]:
        raise CorruptionError(f"{where}: list {'/'.join(keys) or '<root>'!r} has positions"
                              f" {positions}, not 0..{len(positions) - 1}")
    return [children[p] for p in positions]
