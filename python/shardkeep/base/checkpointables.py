"""Checkpointable kinds: how a named part of a checkpoint is saved and loaded.

The format knows three base kinds:

* ``pytree``: arrays and scalars (any value not matched below);
* ``json``: a JSON document, chosen by wrapping the value in ``JsonValue``;
* ``bytes``: an opaque blob, chosen for ``bytes``/``bytearray``/``memoryview``.

``register_kind`` adds a user kind that maps a Python type onto one of them
(e.g. a data-loader state saved as bytes). Its name is recorded in the
checkpointable's meta.json as ``"registered_kind"``, and loading applies its
``load`` function when the kind is registered in the loading process (and
returns the base value otherwise).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from .. import _core
from ..errors import InvalidArgumentError

BASE_KINDS = ("pytree", "json", "bytes")


@dataclasses.dataclass(frozen=True)
class JsonValue:
    """Marks a checkpointable to be saved as a JSON document (kind ``json``)."""

    value: Any


@dataclasses.dataclass(frozen=True)
class Kind:
    """A registered kind: values of ``type`` are saved as ``base`` via ``save``."""

    name: str
    base: str
    type: type
    save: Callable[[Any], Any]
    load: Callable[[Any], Any]


_registry: dict[str, Kind] = {}


def register_kind(name: str, *, base: str, type: type, save: Callable[[Any], Any],
                  load: Callable[[Any], Any]) -> None:
    """Registers a checkpointable kind for values of class ``type``.

    ``save(value)`` returns the base value: a pytree, a JSON-serialisable
    object (base "json") or bytes (base "bytes"). ``load(base_value)``
    inverts it. Registering a name again replaces the earlier kind.
    """
    if base not in BASE_KINDS:
        raise InvalidArgumentError(f"kind base must be one of {BASE_KINDS}, got {base!r}")
    if name in BASE_KINDS:
        raise InvalidArgumentError(f"kind name {name!r} is reserved")
    _registry[name] = Kind(name, base, type, save, load)


def check_name(name) -> None:
    """Refuses a checkpointable name that the core's rule refuses (the rule
    of every save path and of the commit record's decoder)."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"checkpointable name {name!r} must be a string")
    _core.check_checkpointable_name(name)


@dataclasses.dataclass(frozen=True)
class Classified:
    """What a value is saved as: its base kind, the base value (a
    registered kind's ``save`` applied) and the registered kind's name."""

    kind: str
    value: Any
    registered_kind: str | None = None


def classify(value: Any) -> Classified:
    """The base kind and value that ``value`` is saved as: a registered
    kind's (by the value's class), bytes, json (``JsonValue``), else pytree."""
    registered = next((k for k in _registry.values() if isinstance(value, k.type)), None)
    if registered is not None:
        return Classified(registered.base, registered.save(value), registered.name)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Classified("bytes", value)
    if isinstance(value, JsonValue):
        return Classified("json", value.value)
    return Classified("pytree", value)


def value_part(name: str, base: Classified) -> _core.SavePart:
    """The save part of a json or bytes checkpointable (a pytree's is staged:
    ``shardkeep.saving.staging``)."""
    if base.kind not in ("json", "bytes"):
        raise ValueError(f"value_part of a {base.kind} checkpointable")
    if base.kind == "json":
        try:
            value = json.dumps(base.value, allow_nan=False, ensure_ascii=False).encode()
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"checkpointable {name!r} is not valid JSON: {e}") from e
    else:
        value = bytes(base.value)
    meta = _core.encode_value_meta(base.kind, base.registered_kind or "")
    return _core.SavePart(name, base.kind, meta, value)


def decode(registered_kind: str, base_value: Any) -> Any:
    """Applies a registered kind's ``load`` to a loaded base value, if any
    (``registered_kind``: the one it was saved as, or "")."""
    registered = _registry.get(registered_kind) if registered_kind else None
    return registered.load(base_value) if registered is not None else base_value
