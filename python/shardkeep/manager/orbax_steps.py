"""Orbax steps under a manager's root: a run moved from Orbax resumes.

A root that orbax-checkpoint's ``CheckpointManager`` wrote holds step
folders ``<step>`` or ``<prefix>_<step>`` with ``_CHECKPOINT_METADATA``
(``shardkeep.interop.orbax``). The manager lists them beside its own
steps, loads them through ``OrbaxSource`` (what ``shardkeep.load_orbax``
reads with) and saves its next steps in shardkeep's format beside them.

An Orbax step's items are its checkpointables: ``default`` (the one
unnamed item) is "state", every other item keeps its name; pytree items
load onto targets, JSON items (``args.JsonSave``) come back as their
value. Retention never deletes an Orbax step (docs/MANAGER.md, "Resuming
from Orbax steps"): Orbax's own manager may still run on the root, and
those folders are the only copy of the run before the move.

The listing finds them (``shardkeep.manager.step_listing``); this loads them.
"""

from __future__ import annotations

import os
from typing import Any

from .. import options as options_lib
from ..base import events, named_parts
from ..errors import IncompatibleError, InvalidArgumentError, NotFoundError
from ..interop import orbax, orbax_folders
from ..loading import load_executor
from ..loading.other_formats import ORBAX_ITEM_MARKER

# The item an unnamed save writes (``args.StandardSave`` alone), read as
# the checkpointable "state", the one tree of shardkeep's own saves.
_DEFAULT_ITEM = "default"


def load(path: str, target: Any, *, partial: bool, options: options_lib.Options) -> Any:
    """Loads the Orbax step at ``path`` as ``CheckpointManager.load`` loads
    a step of its own: a ``Checkpointables`` target names items (an empty
    one: all), anything else is the target of "state"; reported to
    ``jax.monitoring`` as ``shardkeep.load`` reports its loads."""
    with events.loading(path) as report:
        return report.loaded(_load(path, target, partial=partial, options=options))


def _load(path: str, target: Any, *, partial: bool, options: options_lib.Options) -> Any:
    targets = named_parts.to_load(target)
    items = _items(path)
    if targets is None:
        targets = {name: None for name in items}
    values = {}
    for name, item_target in targets.items():
        if name not in items:
            raise _no_item(path, name, sorted(items), one_tree=not named_parts.named(target))
        folder, handler = items[name]
        if handler is not None:
            raise IncompatibleError(f"Orbax step {path}: item {name!r} was saved by {handler},"
                                    " which shardkeep cannot read")
        if not os.path.isfile(os.path.join(folder, ORBAX_ITEM_MARKER)):
            if item_target is not None:
                raise InvalidArgumentError(f"Orbax step {path}: item {name!r} is a JSON value,"
                                           " which takes no target")
            values[name] = orbax_folders.read_json_item(folder)
            continue
        source = orbax.OrbaxSource(folder, options)
        values[name] = load_executor.load_with(source, item_target, path=source.directory,
                                               partial=partial, options=options)
    return named_parts.loaded(target, values)


def custom_metadata(path: str) -> dict:
    """The custom metadata the Orbax step at ``path`` was saved with."""
    return orbax_folders.custom_metadata(path)


def _items(path: str) -> dict[str, tuple[str, str | None]]:
    """{checkpointable name: (item folder, None when shardkeep reads it,
    else the handler that wrote it)} of the step folder ``path``."""
    handlers = orbax_folders.item_handlers(orbax_folders.step_metadata(path))
    items = {}
    for item in sorted(os.listdir(path)):
        folder = os.path.join(path, item)
        if not os.path.isdir(folder):
            continue
        handler = handlers.get(item)
        readable = (os.path.isfile(os.path.join(folder, ORBAX_ITEM_MARKER))
                    or orbax_folders.is_json_handler(handler))
        if not readable and handler is None:
            continue  # not an item: another tool's folder
        name = named_parts.STATE if item == _DEFAULT_ITEM else item
        items[name] = (folder, None if readable else str(handler))
    return items


def _no_item(path: str, name: str, available: list[str], *, one_tree: bool) -> NotFoundError:
    if one_tree:
        return named_parts.no_state(
            f"Orbax step {path}", available,
            f"manager.load(step, sk.Checkpointables({named_parts.listing(available)}))")
    return NotFoundError(f"Orbax step {path} has no item {name!r}; its items, named as"
                         f" checkpointables, are {available}")
