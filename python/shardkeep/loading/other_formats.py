"""Recognising other formats' checkpoints by their files.

One place knows what marks an Orbax, DCP or safetensors checkpoint on
disk, so that a shardkeep function given one can name the function that
reads it instead of failing on a missing ``_SHARDKEEP``; the readers in
``shardkeep.interop`` take the markers from here.
"""

from __future__ import annotations

import os

from .. import _core
from ..errors import InvalidArgumentError

# An Orbax item holds _METADATA (its tree); a step folder written by
# Orbax's CheckpointManager holds _CHECKPOINT_METADATA.
ORBAX_ITEM_MARKER = "_METADATA"
ORBAX_STEP_MARKER = "_CHECKPOINT_METADATA"
DCP_METADATA_FILE = ".metadata"
_SAFETENSORS_SUFFIXES = (".safetensors", ".safetensors.index.json")

# The call that reads each format, as the hint names it.
_READERS = {
    "orbax": "shardkeep.load_orbax(path, target)",
    "dcp": "shardkeep.load_dcp(path, target, allow_pickle=True)",
    "safetensors": "shardkeep.load_safetensors(path, target)",
}
_NAMES = {"orbax": "an Orbax checkpoint", "dcp": "a PyTorch DCP checkpoint",
          "safetensors": "safetensors"}


def identify(path: str) -> str | None:
    """"orbax", "dcp" or "safetensors" when the local ``path`` holds such a
    checkpoint, else None (object stores are not looked at)."""
    try:
        local = _core.Location(path).local_path
    except InvalidArgumentError:
        return None  # no backend reads it
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
    """What to call for the other format's checkpoint at ``path``, or None."""
    fmt = identify(path)
    if fmt is None:
        return None
    return (f"{path} is {_NAMES[fmt]}, not a shardkeep checkpoint: read it with"
            f" {_READERS[fmt]}, or convert it with shardkeep.convert(path, dst,"
            f" source_format={fmt!r})")


def holds_orbax_item(folder: str, names: list[str]) -> bool:
    """Whether ``folder`` (whose entries are ``names``) is an Orbax item, a
    step folder of one, or a CheckpointManager directory."""
    markers = (ORBAX_ITEM_MARKER, ORBAX_STEP_MARKER)
    if any(marker in names for marker in markers):
        return True
    return any(os.path.isfile(os.path.join(folder, name, marker))
               for name in names for marker in markers)
