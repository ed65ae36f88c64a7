"""Removing what saves and deletions cut short left under a root.

Shared by the manager's persistent root and the local tier's slice
folders: both list their root with the core's ``list_checkpoints``, whose
entry states say what each folder is.
"""

from __future__ import annotations

import logging

from . import _core
from . import options as options_lib
from .errors import InvalidArgumentError, ShardkeepError

logger = logging.getLogger("shardkeep")

_OLD_SUFFIX = ".shardkeep-old"


def collect(root: str, entries: list[tuple], committed: set[str],
            options: options_lib.Options) -> None:
    """Removes the stale entries of ``root`` (listed as ``entries``):
    temporary, half-deleted and unfinished folders, and a replaced step's
    old copy once its replacement (named in ``committed``) is committed;
    otherwise that old copy may be the step's only one and is kept."""
    for name, state, *_ in entries:
        path = join(root, name)
        if state in ("temporary", "being-deleted", "unfinished"):
            logger.info("removing stale %s", path)
            remove_quietly(path, options)
        elif state == "replaced":
            if name[:-len(_OLD_SUFFIX)] in committed:
                logger.info("removing %s: its replacement is committed", path)
                remove_quietly(path, options)
            else:
                logger.warning("%s is kept: it may be the only copy of that step", path)


def remove_quietly(path: str, options: options_lib.Options) -> bool:
    """Removes a leftover folder; a failure is logged, and retried by a later
    listing. Returns False when the folder may still be there."""
    try:
        _core.remove_leftover(path, options.to_core())
    except InvalidArgumentError as e:
        # Not a leftover after all (a committed checkpoint, someone's
        # data): the core removed nothing, and trying again would not help.
        logger.info("%s is not removed: %s", path, e)
        return True
    except ShardkeepError as e:
        logger.warning("could not remove %s: %s", path, e)
        return False
    return True


def join(root: str, name: str) -> str:
    """``root/name`` for paths and URLs alike."""
    return f"{root}/{name}" if not root.endswith("/") else root + name
