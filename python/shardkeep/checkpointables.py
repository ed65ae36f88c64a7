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

from . import _core, staging
from .errors import InvalidArgumentError

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


def encode(name: str, value: Any) -> dict:
    """The ``_core.start_save`` part dict for checkpointable ``name``, plus
    "aliased": the shards whose bytes belong to the caller (see
    ``staging.stage_pytree``)."""
    check_name(name)
    registered = next((k for k in _registry.values() if isinstance(value, k.type)), None)
    if registered is not None:
        return _encode_base(name, registered.base, registered.save(value), registered.name)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _encode_base(name, "bytes", value)
    if isinstance(value, JsonValue):
        return _encode_base(name, "json", value.value)
    return _encode_base(name, "pytree", value)


def _encode_base(name: str, kind: str, value: Any, registered_kind: str | None = None) -> dict:
    part = {"name": name, "kind": kind, "value": b"", "shards": [], "aliased": []}
    if kind == "pytree":
        part["meta_json"], part["shards"], part["aliased"] = staging.stage_pytree(
            value, registered_kind=registered_kind)
        return part
    meta = {"kind": kind}
    if registered_kind is not None:
        meta["registered_kind"] = registered_kind
    part["meta_json"] = _core.encode_meta(meta)
    if kind == "json":
        try:
            part["value"] = json.dumps(value, allow_nan=False, ensure_ascii=False).encode()
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"checkpointable {name!r} is not valid JSON: {e}") from e
    else:
        part["value"] = bytes(value)
    return part


def decode(meta: dict, base_value: Any) -> Any:
    """Applies a registered kind's ``load`` to a loaded base value, if any."""
    registered = _registry.get(meta.get("registered_kind"))
    return registered.load(base_value) if registered is not None else base_value
