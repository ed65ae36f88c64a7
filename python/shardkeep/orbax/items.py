"""Orbax's ``ocp.args`` as what shardkeep saves and loads, and the way back.

A save's args become the value given to ``shardkeep.CheckpointManager.save``:
one item's tree (the checkpointable "state"), or a ``Composite``'s items as
a ``shardkeep.Checkpointables`` (a ``JsonSave`` item as a
``shardkeep.JsonValue``). A restore's args become the target of its load,
and the loaded values come back shaped as Orbax returns them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import shardkeep as sk

from . import args as args_lib
from .refusals import Unsupported, check, refused

_SAVES = "args.StandardSave, args.PyTreeSave, args.JsonSave or an args.Composite of them"
_RESTORES = ("args.StandardRestore, args.PyTreeRestore, args.JsonRestore or an args.Composite"
             " of them (an item None: as saved)")


def to_save(args: Any, item_names: Sequence[str] | None) -> Any:
    """The value a save of ``args`` gives shardkeep's manager."""
    if args is None:
        raise sk.InvalidArgumentError(
            f"CheckpointManager.save needs args=: {_SAVES} (the legacy items= is refused)")
    if isinstance(args, args_lib.Composite):
        _check_names("save", args, item_names)
        return sk.Checkpointables({name: _save_value(f"args.Composite item {name!r}", arg)
                                   for name, arg in args.items()})
    if item_names is not None:
        raise sk.InvalidArgumentError(
            f"CheckpointManager.save: a manager with item_names={list(item_names)} saves an"
            f" args.Composite of them, got {type(args).__name__}")
    return _save_value("CheckpointManager.save args", args)


def _save_value(where: str, arg: Any) -> Any:
    if isinstance(arg, (args_lib.StandardSave, args_lib.PyTreeSave)):
        name = type(arg).__name__
        unsupported = {
            "save_args": Unsupported(
                arg.save_args, None, "cast the arrays before saving; shardkeep.Options sets"
                " chunking and compression for every array"),
            "custom_metadata": Unsupported(
                arg.custom_metadata, None, "give the step's metadata to the manager's"
                " save(custom_metadata=)"),
        }
        if isinstance(arg, args_lib.PyTreeSave):
            unsupported["ocdbt_target_data_file_size"] = Unsupported(
                arg.ocdbt_target_data_file_size, None,
                "shardkeep sizes its data files itself (docs/FORMAT.md)")
        check(f"{where} ({name})", unsupported)
        return arg.item
    if isinstance(arg, args_lib.JsonSave):
        return sk.JsonValue(arg.item)
    raise sk.InvalidArgumentError(f"{where}: {_kind(arg)} is not saved by shardkeep.orbax;"
                                  f" give {_SAVES}")


class Load(NamedTuple):
    """What a restore loads: shardkeep's target and ``partial``, and whether
    the values come back as a Composite."""

    target: Any
    partial: bool
    composite: bool


def to_load(args: Any, item_names: Sequence[str] | None) -> Load:
    """The load a restore with ``args`` makes (None: every item, as saved)."""
    if args is None:
        # Orbax restores every item as saved; one unnamed item comes back alone.
        return Load(sk.Checkpointables(), False, True)
    if isinstance(args, args_lib.Composite):
        _check_names("restore", args, item_names)
        loads = {name: _item_load(f"args.Composite item {name!r}", arg)
                 for name, arg in args.items()}
        partial = {name for name, (_, p) in loads.items() if p}
        if partial and len(partial) != len(loads):
            raise refused("CheckpointManager.restore", "partial_restore", True,
                          f"give it for every item of the Composite or none (given for"
                          f" {sorted(partial)} only): shardkeep loads one checkpoint whole"
                          f" or partially")
        return Load(sk.Checkpointables({name: target for name, (target, _) in loads.items()}),
                    bool(partial), True)
    if item_names is not None:
        raise sk.InvalidArgumentError(
            f"CheckpointManager.restore: a manager with item_names={list(item_names)} restores"
            f" an args.Composite of them, got {type(args).__name__}")
    return Load(*_item_load("CheckpointManager.restore args", args), False)


def _item_load(where: str, arg: Any) -> tuple[Any, bool]:
    """(target, partial) of one item."""
    if arg is None or isinstance(arg, args_lib.JsonRestore):
        return None, False
    if isinstance(arg, args_lib.StandardRestore):
        check(f"{where} (StandardRestore)", {
            "strict": Unsupported(arg.strict, True, "shardkeep never pads or truncates arrays;"
                                  " a shape that differs is an IncompatibleError"),
            "support_layout": Unsupported(arg.support_layout, False,
                                          "arrays are loaded with their default layouts"),
            "fallback_sharding": Unsupported(
                arg.fallback_sharding, None, "give every leaf of item its sharding"
                " (jax.ShapeDtypeStruct(..., sharding=...))"),
        })
        return arg.item, False
    if isinstance(arg, args_lib.PyTreeRestore):
        check(f"{where} (PyTreeRestore)", {
            "restore_args": Unsupported(
                arg.restore_args, None, "give the shardings and dtypes in item, as"
                " jax.ShapeDtypeStruct(shape, dtype, sharding=...) leaves"),
            "transforms": Unsupported(arg.transforms, None,
                                      "load, then rearrange the tree in Python"),
            "legacy_transform_fn": Unsupported(arg.legacy_transform_fn, None,
                                               "load, then rearrange the tree in Python"),
        })
        return arg.item, bool(arg.partial_restore)
    raise sk.InvalidArgumentError(f"{where}: {_kind(arg)} is not restored by shardkeep.orbax;"
                                  f" give {_RESTORES}")


def loaded(load: Load, values: Any, item_names: Sequence[str] | None) -> Any:
    """What Orbax's restore returns: a Composite of the items, or the one
    item of a manager without item_names restored without args."""
    if not load.composite:
        return values
    items = dict(values)
    if item_names is None and not load.target and set(items) == {"state"}:
        return items["state"]
    return args_lib.Composite(**items)


def _check_names(call: str, composite: args_lib.Composite,
                 item_names: Sequence[str] | None) -> None:
    if item_names is None:
        return
    unknown = [name for name in composite if name not in item_names]
    if unknown:
        raise sk.InvalidArgumentError(
            f"CheckpointManager.{call}: items {unknown} are not among the manager's"
            f" item_names {list(item_names)}")


def _kind(arg: Any) -> str:
    kind = type(arg)
    if kind.__module__.startswith("orbax."):
        return (f"Orbax's own {kind.__name__} (an orbax.checkpoint class: build the args"
                f" from shardkeep.orbax.args)")
    return f"{kind.__module__}.{kind.__qualname__}"
