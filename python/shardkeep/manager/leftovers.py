"""Removing what saves and deletions cut short left under a root.

Shared by the manager's persistent root and the local tier's slice
folders. The core decides what is a leftover (``_core.collect_leftovers``,
the policy ``shardkeep gc`` uses too, which never removes the only copy
of a checkpoint); this module logs what it did.
"""

from __future__ import annotations

import logging

from .. import _core
from .. import options as options_lib
from ..errors import InvalidArgumentError, ShardkeepError

logger = logging.getLogger("shardkeep")


def collect(root: str, entries: list[_core.RootEntry], options: options_lib.Options) -> None:
    """Removes the leftovers among ``entries`` (``_core.list_checkpoints(root)``)."""
    for done in _core.collect_leftovers(root, entries, options.to_core()):
        path = join(root, done.name)
        if done.outcome is _core.CollectOutcome.REMOVED:
            logger.info("removed stale %s (%s)", path, done.state.name.lower())
        elif done.outcome is _core.CollectOutcome.FAILED:
            logger.warning("could not remove %s: %s", path, done.problem)
        elif done.state is _core.EntryState.ONLY_COPY:
            logger.warning("%s", done.problem)


def remove_quietly(path: str, options: options_lib.Options) -> bool:
    """Removes a leftover folder; a failure is logged, and retried by a later
    listing. Returns False when the folder may still be there."""
    try:
        _core.remove_leftover(path, options.to_core())
    except InvalidArgumentError as e:
        # Not a leftover after all (a committed checkpoint, an only copy,
        # someone's data): the core removed nothing, and trying again would
        # not help.
        logger.info("%s is not removed: %s", path, e)
        return True
    except ShardkeepError as e:
        logger.warning("could not remove %s: %s", path, e)
        return False
    return True


def join(root: str, name: str) -> str:
    """``root/name`` for paths and URLs alike."""
    return f"{root}/{name}" if not root.endswith("/") else root + name
