"""Loading checkpoints: whole, or some checkpointables only."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from .. import _core
from ..base import checkpointables, events, named_parts, unchanged
from . import load_executor
from .. import options as options_lib
from ..errors import InvalidArgumentError, NotFoundError
from ..base.gc_pause import gc_paused
from . import other_formats as formats
from .load_source import CoreSource


def load(path, target: Any = None, *, partial: bool = False,
         options: options_lib.Options | None = None) -> Any:
    """Loads the checkpointable "state" (what ``save`` wrote), or named parts.

    A ``Checkpointables`` target names the parts to load (each with its
    target; an empty one loads every part) and the result is a
    Checkpointables; any other target, a plain dict included, is the target
    of "state" (see ``shardkeep.base.named_parts``). On a checkpoint of named
    parts without "state", the NotFoundError says how to load them.

    ``target`` says what to build, leaf by leaf, matched to saved leaves by
    key path:

    * ``jax.ShapeDtypeStruct`` (with ``.sharding``) or a ``jax.Array``: a
      ``jax.Array`` with that shape, dtype and sharding (resharding as
      needed; a struct without sharding goes to the default device);
    * numpy array or scalar: a numpy result of that dtype;
    * None (the whole target or one leaf): numpy arrays for array leaves and
      Python values for scalar, str and None leaves.

    Without a target, containers are rebuilt from the saved structure
    (dicts, lists, tuples, named tuples; other pytree nodes as dicts); with
    one, the target's own tree structure is used, so registered classes
    (optax, flax) come back as themselves.

    A dtype that differs from the saved one is cast by the core; casts that
    may lose values need ``Options(allow_lossy_cast=True)``. A shape that
    differs raises IncompatibleError. Target leaves missing from the
    checkpoint always raise IncompatibleError; checkpoint leaves missing
    from the target raise it too unless ``partial=True``, which loads just
    the leaves the target names.
    """
    values = _load(path, named_parts.to_load(target), partial, options,
                   one_tree=not named_parts.named(target))
    return named_parts.loaded(target, values)


def load_checkpointables(path, targets: Mapping[str, Any] | None = None, *,
                         partial: bool = False,
                         options: options_lib.Options | None = None) -> dict[str, Any]:
    """Loads the named checkpointables; reads no other checkpointable's files.

    ``targets`` maps each checkpointable to load to its target (see
    ``load``; None for no target); None loads every checkpointable.
    Kind "json" comes back as the JSON object, kind "bytes" as bytes; their
    target must be None. Raises NotFoundError if ``path`` holds no committed
    checkpoint or lacks a named checkpointable.
    """
    return _load(path, targets, partial, options, one_tree=False)


def _load(path, targets: Mapping[str, Any] | None, partial: bool,
          options: options_lib.Options | None, *, one_tree: bool) -> dict[str, Any]:
    """``load_checkpointables``; ``one_tree``: the caller asked for "state" alone."""
    path = os.fspath(path)
    with events.loading(path) as report:
        return report.loaded(_load_recorded(path, targets, partial, options, one_tree=one_tree))


def _load_recorded(path: str, targets: Mapping[str, Any] | None, partial: bool,
                   options: options_lib.Options | None, *, one_tree: bool) -> dict[str, Any]:
    options = options_lib.resolve(options)
    core_options = options.to_core()
    reader = formats.open_reader(path, core_options)
    # Only the file backend's paths are files that can be mapped.
    map_files = options.map_files and _core.Location(path).local_path is not None
    record = reader.commit
    available = record.checkpointables  # name -> kind
    if targets is None:
        targets = {name: None for name in available}
    if not isinstance(targets, Mapping):
        raise InvalidArgumentError(
            f"targets must map checkpointable names to targets, got {type(targets).__name__}")
    results = {}
    for name, target in targets.items():
        if name not in available:
            if one_tree:
                names = sorted(available)
                raise named_parts.no_state(
                    f"checkpoint {path!r}", names,
                    f"sk.load_checkpointables({path!r}) (all, or a mapping of name to target)"
                    f" or sk.load({path!r}, sk.Checkpointables({named_parts.listing(names)}))")
            raise NotFoundError(
                f"checkpoint {path!r} has no checkpointable {name!r}; it has {sorted(available)}")
        origin = unchanged.Origin(path, name, record.created_ns)
        results[name] = _load_one(reader, origin, available[name], target,
                                  partial, core_options, map_files,
                                  options.broadcasts_load_of(path), options.donate_target)
    return results


def _load_one(reader, origin: unchanged.Origin, kind: str, target: Any, partial: bool,
              core_options, map_files: bool, broadcast: bool, donate: bool) -> Any:
    name = origin.checkpointable
    where = f"{origin.checkpoint}/{name}"
    if kind == "pytree":
        source = CoreSource(reader, name, where, core_options, map_files=map_files,
                            origin=origin)
        with gc_paused():
            value = load_executor.load(source, target, partial=partial, broadcast=broadcast,
                                       allow_lossy_cast=core_options.allow_lossy_cast,
                                       timeout_s=core_options.timeout_s, donate=donate)
        return checkpointables.decode(source.meta().registered_kind, value)
    if target is not None:
        raise InvalidArgumentError(f"{where} is of kind {kind!r}, which takes no target")
    raw = reader.read_value(name)
    value = json.loads(raw) if kind == "json" else raw
    return checkpointables.decode(reader.registered_kind(name), value)
