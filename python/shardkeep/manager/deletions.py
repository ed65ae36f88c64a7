"""The manager's deletion and collection work under its root.

Retention drops steps from the record (``shardkeep.manager.step_record``);
this deletes their folders, on the primary alone, through the core:
rename to ``<name>.shardkeep-deleting``, then remove, so a half-deleted
checkpoint never looks committed. It runs where the drop happens: on the
save queue's thread, in the end of the save whose commit dropped them
(``shardkeep.manager.commits``), or on the caller's thread when a load
or a save lets go of a step dropped while it was in use. Its errors are
kept in ``BackgroundErrors`` and raised by the next ``save``, ``wait``
or ``close``.

It also removes what failed saves left (``<step>.shardkeep-tmp``; on
object stores the generations inside ``<step>``) before the next save
starts and in ``wait``, so that one failure's partial files (a full
disk's) do not make every later save fail too.
"""

from __future__ import annotations

import logging
import threading

from .. import _core
from .. import options as options_lib
from ..errors import ShardkeepError
from . import leftovers
from .background_errors import BackgroundErrors
from .step_record import Dropped

logger = logging.getLogger("shardkeep")


class Deletions:
    def __init__(self, root: str, options: options_lib.Options, primary: bool,
                 errors: BackgroundErrors):
        self._root = root
        self._options = options
        self._primary = primary
        self._errors = errors
        self._lock = threading.Lock()
        self._leftovers: list[str] = []  # what failed saves may have left

    def delete(self, dropped: list[Dropped]) -> None:
        """Deletes the folders of ``dropped`` steps (primary only)."""
        if not self._primary:
            return
        for step in dropped:
            path = leftovers.join(self._root, step.name)
            try:
                _core.delete_checkpoint(path, self._options.to_core())
            except ShardkeepError as e:
                self._errors.record(f"deleting step {step.step} at {path!r} failed", e)
                continue
            logger.info("deleted step %d (%s)", step.step, path)

    def delete_local(self, paths: list[str]) -> None:
        """Deletes local-tier steps (every process: its own local root)."""
        for path in paths:
            try:
                _core.delete_checkpoint(path, self._options.to_core())
            except ShardkeepError as e:
                self._errors.record(f"deleting local checkpoint {path!r} failed", e)

    def note_failed_save(self, name: str) -> None:
        """Notes what the failed save of folder ``name`` may have left."""
        # The temporary folder (storage with rename), or the step's own
        # folder holding uncommitted generations (object stores); the core
        # removes whichever exists and refuses anything else.
        with self._lock:
            self._leftovers += [_core.temporary_folder(leftovers.join(self._root, name)),
                                leftovers.join(self._root, name)]

    def remove_leftovers(self) -> None:
        """Removes the leftovers of failed saves (primary): before a save, in ``wait``.

        Every step goes to a new path, so without this they would pile up
        and keep the disk full. One that cannot be removed now is tried
        again before the following save.
        """
        with self._lock:
            paths, self._leftovers = self._leftovers, []
        if not self._primary:
            return
        kept = [path for path in paths if not leftovers.remove_quietly(path, self._options)]
        if kept:
            with self._lock:
                self._leftovers[:0] = kept
