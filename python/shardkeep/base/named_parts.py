"""What a value passed to save or load means: one tree, or named parts.

One rule for every entry point (``save``, ``save_async``, ``load``, and the
CheckpointManager's ``save``, ``load`` and ``restore``): a
``Checkpointables`` holds named parts, each its own checkpointable;
anything else, a plain ``dict`` included, is the one tree saved as (or
loaded from) the checkpointable "state". The explicit functions
``save_checkpointables`` and ``load_checkpointables`` take a mapping of
parts as they always did.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..errors import NotFoundError

STATE = "state"


class Checkpointables(Mapping[str, Any]):
    """Named parts of one checkpoint, each saved (and loadable) on its own.

    ``sk.save(path, sk.Checkpointables(params=params, data=sk.JsonValue(d)))``
    saves two checkpointables; ``sk.load(path, sk.Checkpointables(params=target))``
    loads only "params" and returns a Checkpointables. A plain dict is never
    read as parts: it is one tree, the checkpointable "state". Immutable.
    """

    __slots__ = ("_parts",)
    _parts: dict[str, Any]

    def __init__(self, parts: Mapping[str, Any] | None = None, /, **named: Any):
        merged = dict(parts or {})
        merged.update(named)
        object.__setattr__(self, "_parts", merged)

    def __getitem__(self, name: str) -> Any:
        return self._parts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Checkpointables is immutable")

    def __repr__(self) -> str:
        return f"Checkpointables({self._parts!r})"


def named(value: Any) -> bool:
    """Whether ``value`` (a value to save or a target) names parts."""
    return isinstance(value, Checkpointables)


def to_save(value: Any) -> dict[str, Any]:
    """The checkpointables a save of ``value`` writes."""
    return dict(value) if named(value) else {STATE: value}


def to_load(target: Any) -> dict[str, Any] | None:
    """The checkpointables a load with ``target`` reads (None: all of them,
    only for a Checkpointables with no parts)."""
    if named(target):
        return dict(target) or None
    return {STATE: target}


def loaded(target: Any, values: dict[str, Any]) -> Any:
    """What a load with ``target`` returns, from the loaded checkpointables."""
    return Checkpointables(values) if named(target) else values[STATE]


def no_state(where: str, available: list[str], calls: str) -> NotFoundError:
    """The error of loading one tree from ``where``, which holds named parts;
    ``calls`` says what reads them (``listing`` helps write it)."""
    return NotFoundError(f"{where} holds the named checkpointables {available}, not one"
                         f" tree 'state': load them with {calls}")


def listing(available: list[str]) -> str:
    """``a=..., b=...``: the arguments of a Checkpointables naming ``available``."""
    return ", ".join(f"{name}=..." for name in available)
