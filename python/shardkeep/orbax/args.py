"""``shardkeep.orbax.args``: the argument classes of Orbax's ``ocp.args``.

Each has the fields, order and defaults of its Orbax class (orbax-checkpoint
0.12), so that code written as ``ocp.args.StandardSave(state)`` runs
unchanged. What each means to shardkeep (``shardkeep.orbax.items``):

* ``StandardSave``/``PyTreeSave``: a pytree, saved as one checkpointable;
  ``StandardRestore``/``PyTreeRestore``: its target (abstract or concrete
  arrays, their shardings the ones loaded onto), ``PyTreeRestore``'s
  ``partial_restore`` being ``shardkeep.load``'s ``partial``;
* ``JsonSave``/``JsonRestore``: a JSON document (``shardkeep.JsonValue``);
* ``Composite``: named items, each its own checkpointable
  (``shardkeep.Checkpointables``); a restore returns a ``Composite``.

The fields shardkeep does not support are refused when the argument is
used (``shardkeep.orbax.refusals``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping


@dataclasses.dataclass
class StandardSave:
    item: Any
    save_args: Any = None
    custom_metadata: Any = None


@dataclasses.dataclass
class StandardRestore:
    item: Any = None
    strict: bool = True
    support_layout: bool = False
    fallback_sharding: Any = None


@dataclasses.dataclass
class PyTreeSave:
    item: Any
    save_args: Any = None
    ocdbt_target_data_file_size: int | None = None
    custom_metadata: Any = None


@dataclasses.dataclass
class PyTreeRestore:
    item: Any = None
    restore_args: Any = None
    transforms: Any = None
    transforms_default_to_original: bool = True
    legacy_transform_fn: Any = None
    partial_restore: bool = False


@dataclasses.dataclass
class JsonSave:
    item: Any


@dataclasses.dataclass
class JsonRestore:
    item: Any = None  # unused, as in Orbax


class Composite(Mapping[str, Any]):
    """Named items: ``Composite(state=StandardSave(s), meta=JsonSave(m))``.

    Read as a mapping (``c["state"]``) or by attribute (``c.state``), as
    Orbax's ``Composite`` is; a restore returns one holding the values.
    """

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, **items: Any):
        object.__setattr__(self, "_items", items)

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            raise AttributeError(
                f"Composite has no item {name!r}; its items: {list(self._items)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Composite is immutable")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Composite({', '.join(f'{k}={v!r}' for k, v in self._items.items())})"
