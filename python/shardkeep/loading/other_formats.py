"""Recognising other formats' checkpoints by their files.

One place knows what marks an Orbax, DCP or safetensors checkpoint on
disk, so that a shardkeep function given one can name the function that
reads it instead of failing on a missing ``_SHARDKEEP``; the readers in
``shardkeep.interop`` take the markers from here.
"""

from __future__ import annotations

import os
import re

from .. import _core
from ..errors import InvalidArgumentError, NotFoundError, ShardkeepError

# An Orbax item holds _METADATA (its tree); a step folder written by
# Orbax's CheckpointManager holds _CHECKPOINT_METADATA.
ORBAX_ITEM_MARKER = "_METADATA"
ORBAX_STEP_MARKER = "_CHECKPOINT_METADATA"
DCP_METADATA_FILE = ".metadata"
_SAFETENSORS_SUFFIXES = (".safetensors", ".safetensors.index.json")
# Orbax's step folder names: the step, after a prefix and '_' if any.
_STEP_FOLDER = re.compile(r"(?:.+_)?(\d+)")
# A root's steps are named in full up to this many, else the first and last.
_STEPS_NAMED = 8

# The call that reads each format, as the hint names it.
_READERS = {
    "orbax": "shardkeep.load_orbax({path!r}, target)",
    "dcp": "shardkeep.load_dcp({path!r}, target, allow_pickle=True)",
    "safetensors": "shardkeep.load_safetensors({path!r}, target)",
}
_NAMES = {"orbax": "an Orbax checkpoint", "dcp": "a PyTorch DCP checkpoint",
          "safetensors": "safetensors"}


def open_reader(path: str, core_options: _core.Options) -> _core.Reader:
    """The core's reader of the shardkeep checkpoint at ``path``; when
    ``path`` holds another format's checkpoint, a NotFoundError that says
    which and names the call that reads it (not the core's missing
    ``_SHARDKEEP``)."""
    try:
        return _core.Reader(path, core_options)
    except ShardkeepError as e:  # NotFound for a folder, a storage error for a file
        hint = reader_hint(path)
        if hint is None:
            raise
        raise NotFoundError(hint) from e


def identify(path: str) -> str | None:
    """"orbax", "dcp" or "safetensors" when the local ``path`` holds such a
    checkpoint, else None (object stores are not looked at)."""
    local = _local(path)
    if local is None:
        return None
    if os.path.isfile(local):
        return "safetensors" if local.endswith(_SAFETENSORS_SUFFIXES) else None
    if not os.path.isdir(local):
        return None
    names = os.listdir(local)
    if holds_orbax_item(local, names):
        return "orbax"
    if DCP_METADATA_FILE in names:
        return "dcp"
    if any(name.endswith(_SAFETENSORS_SUFFIXES) for name in names):
        return "safetensors"
    return None


def reader_hint(path: str) -> str | None:
    """What ``path`` holds and what to call for it, when it is another
    format's checkpoint (which shardkeep reads but never writes), or None."""
    fmt = identify(path)
    if fmt is None:
        return None
    local = _local(path)
    steps = orbax_steps(local) if fmt == "orbax" and local is not None else []
    if steps and not os.path.isfile(os.path.join(local or "", ORBAX_STEP_MARKER)):
        return root_hint(path, steps, "not a shardkeep checkpoint")
    items = _orbax_items(local) if fmt == "orbax" and local is not None else []
    what = f"{path} is {_NAMES[fmt]}, not a shardkeep checkpoint; shardkeep reads it (read-only)"
    if len(items) > 1:  # load_orbax takes one item
        what += f" item by item (it has {', '.join(items)})"
        path = os.path.join(path, items[0])
    pickle = ", allow_pickle=True" if fmt == "dcp" else ""
    return (f"{what}: load it with {_READERS[fmt].format(path=path)}, or convert it"
            f" with shardkeep.convert({path!r}, dst{pickle})")


def root_hint(path: str, steps: list[tuple[int, str]], what: str) -> str:
    """The message for an Orbax ``CheckpointManager`` root given where one
    checkpoint is wanted: its steps, and the calls that take one."""
    latest = os.path.join(path, steps[-1][1])
    numbers = [str(step) for step, _ in steps]
    if len(numbers) > _STEPS_NAMED:
        numbers = numbers[:3] + ["..."] + numbers[-3:]
    return (f"{path} is the root of an Orbax CheckpointManager, {what}; its"
            f" {len(steps)} step(s): {', '.join(numbers)}. Load one with"
            f" shardkeep.load_orbax({latest!r}, target), convert one with"
            f" shardkeep.convert({latest!r}, dst), or resume the run with"
            f" shardkeep.CheckpointManager({path!r}), which lists Orbax steps")


def orbax_steps(folder: str) -> list[tuple[int, str]]:
    """(step, folder name) of the Orbax step folders in ``folder``, by step."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    steps = [(step_of_folder(os.path.join(folder, name)), name) for name in names]
    return sorted((step, name) for step, name in steps if step is not None)


def step_of_folder(folder: str) -> int | None:
    """The step of an Orbax ``CheckpointManager`` step folder (``<step>``
    or ``<prefix>_<step>``, holding ``_CHECKPOINT_METADATA``), else None.
    A save in progress is in a folder of another name until it commits."""
    match = _STEP_FOLDER.fullmatch(os.path.basename(folder))
    if match is None or not os.path.isfile(os.path.join(folder, ORBAX_STEP_MARKER)):
        return None
    return int(match.group(1))


def named_like_step(name: str) -> bool:
    """Whether ``name`` is the name Orbax gives a step folder (whose
    ``_CHECKPOINT_METADATA`` says it is one)."""
    return _STEP_FOLDER.fullmatch(name) is not None


def holds_orbax_item(folder: str, names: list[str]) -> bool:
    """Whether ``folder`` (whose entries are ``names``) is an Orbax item, a
    step folder of one, or a CheckpointManager directory."""
    markers = (ORBAX_ITEM_MARKER, ORBAX_STEP_MARKER)
    if any(marker in names for marker in markers):
        return True
    return any(os.path.isfile(os.path.join(folder, name, marker))
               for name in names for marker in markers)


def _orbax_items(local: str) -> list[str]:
    """The Orbax items in the folder ``local``: none when it is one."""
    if os.path.isfile(os.path.join(local, ORBAX_ITEM_MARKER)):
        return []
    return sorted(name for name in os.listdir(local)
                  if os.path.isfile(os.path.join(local, name, ORBAX_ITEM_MARKER)))


def _local(path: str) -> str | None:
    try:
        return _core.Location(path).local_path
    except InvalidArgumentError:
        return None  # no backend reads it
