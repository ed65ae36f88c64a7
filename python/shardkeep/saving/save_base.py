"""The base of a save: the committed checkpoint it takes its unchanged
arrays from (``shardkeep.base.unchanged``), as its commit record names it."""

from __future__ import annotations

import dataclasses
import os

from .. import _core
from .. import options as options_lib
from ..base import unchanged
from ..errors import NotFoundError
from . import background_saves


@dataclasses.dataclass(frozen=True)
class Base:
    """The committed checkpoint a save takes its unchanged arrays from
    (``shardkeep.base.unchanged``), as its commit record names it."""

    checkpoint: str
    created_ns: int
    # Compare the other arrays with the base's leaves of the same key path
    # (``Options.compare_with_base``).
    compare_contents: bool = False


def base_of(base, options: options_lib.Options) -> Base | None:
    """The committed checkpoint ``base`` (a path, or None) as a save takes
    its unchanged arrays from it.

    A base that an earlier save of this process is still writing is no
    base yet: nothing is known to be in it before that save commits, so
    the save writes everything (rather than waiting, or failing a loop of
    async saves that each name the one before).
    """
    if base is None:
        return None
    base = os.fspath(base)
    try:
        reader = _core.Reader(base, options.to_core())
    except NotFoundError as e:
        key = unchanged.checkpoint_key(base)
        if any(unchanged.checkpoint_key(p) == key for p in background_saves.paths_being_written()):
            return None
        raise NotFoundError(f"the base checkpoint {base!r} of this save is not a committed"
                            f" checkpoint: {e}") from e
    return Base(base, reader.commit.created_ns,
                        compare_contents=options.compare_with_base)
