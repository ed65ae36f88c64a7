"""``shardkeep.orbax.CheckpointManager``: Orbax's v0 manager API over shardkeep's manager.

The calls, argument names and defaults are those of Orbax's
``ocp.CheckpointManager`` (orbax-checkpoint 0.12); the work is
``shardkeep.CheckpointManager``'s: its save decisions and retention are
the policies ``CheckpointManagerOptions`` stands for
(``shardkeep.orbax.options``), and what is saved or restored is what the
``args`` say (``shardkeep.orbax.items``). Differences a program may meet
(docs/ORBAX.md): ``all_steps`` and ``latest_step`` list committed steps
(Orbax also lists the save in flight), and the arguments listed there are
refused by name.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from typing import Any, Mapping, Sequence

import shardkeep as sk

from . import items as items_lib
from .options import CheckpointManagerOptions, manager_arguments
from .refusals import Unsupported, check, refused
from .steps import Steps

logger = logging.getLogger("shardkeep")

_LEGACY = "the legacy API; give args= (shardkeep.orbax.args)"


@dataclasses.dataclass(frozen=True)
class StepMetadata:
    """A step's metadata as Orbax's ``StepMetadata`` has it: the metrics and
    custom metadata it was saved with. The item handlers and item metadata
    are None (``shardkeep.metadata`` describes a step's trees)."""

    metrics: dict = dataclasses.field(default_factory=dict)
    custom_metadata: dict = dataclasses.field(default_factory=dict)
    item_handlers: Any = None
    item_metadata: Any = None


class CheckpointManager:
    """Saves a training run every few steps under ``directory``, as Orbax's does.

    ``item_names`` names the items of a manager that saves an
    ``args.Composite``; without them a save holds one item (or a
    Composite), as in Orbax. ``checkpointers``, ``metadata``,
    ``item_handlers``, ``logger`` and ``handler_registry`` are refused.
    """

    def __init__(self, directory: Any, checkpointers: Any = None,
                 options: CheckpointManagerOptions | None = None,
                 metadata: Mapping[str, Any] | None = None,
                 item_names: Sequence[str] | None = None, item_handlers: Any = None,
                 logger: Any = None, handler_registry: Any = None):
        check("CheckpointManager", {
            "checkpointers": Unsupported(checkpointers, None, _LEGACY),
            "metadata": Unsupported(metadata, None, "shardkeep keeps no root metadata; give"
                                    " it to each step's save (custom_metadata=)"),
            "item_handlers": Unsupported(item_handlers, None, "the args of each item say how"
                                         " it is saved"),
            "logger": Unsupported(logger, None, "shardkeep reports to the 'shardkeep' Python"
                                  " logger and to jax.monitoring"),
            "handler_registry": Unsupported(handler_registry, None, "the args of each item"
                                            " say how it is saved"),
        })
        if options is None:
            options = CheckpointManagerOptions()
        if isinstance(item_names, str):
            raise sk.InvalidArgumentError(
                f"CheckpointManager: item_names must be a sequence of names, got {item_names!r}")
        self._item_names = None if item_names is None else tuple(item_names)
        self._options = options
        arguments = manager_arguments(options)
        self._manager = sk.CheckpointManager(os.fspath(directory), **arguments)
        self._steps = Steps(self._manager, arguments["save_decision_policy"])

    # -- queries ---------------------------------------------------------

    @property
    def directory(self) -> pathlib.Path | str:
        """The root: a ``pathlib.Path``, or the URL of a root on another store."""
        return self._steps.directory

    def all_steps(self, read: bool = False) -> Sequence[int]:
        """The committed steps, in increasing order.

        ``read=True`` (list the root again) is refused: the manager lists
        it once, when created; create a new manager to see steps another
        job saved.
        """
        check("CheckpointManager.all_steps", {
            "read": Unsupported(read, False, "create a new manager to list the root again")})
        return self._manager.all_steps()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The step with the best metrics under ``best_fn``; without one, the latest step."""
        if self._options.best_fn is None:
            return self.latest_step()
        return self._manager.best_step()

    def metrics(self, step: int) -> Any:
        """The metrics step ``step`` was saved with, or None."""
        return self._manager.metrics(step) or None

    def metadata(self, step: int | None = None) -> StepMetadata:
        """Step ``step``'s metrics and custom metadata, as Orbax's
        ``StepMetadata``; the root's metadata (``step`` None) is refused."""
        if step is None:
            raise refused("CheckpointManager.metadata", "step", None,
                          "shardkeep keeps no root metadata; give a step")
        return StepMetadata(metrics=self._manager.metrics(step),
                            custom_metadata=self._manager.custom_metadata(step))

    def reached_preemption(self, step: int) -> bool:
        return self._manager.reached_preemption(step)

    def is_saving_in_progress(self) -> bool:
        """Whether a save this manager started has not yet been seen committed."""
        return self._steps.saving()

    def should_save(self, step: int) -> bool:
        """Whether ``save(step)`` would save (``shardkeep.orbax.steps``); never when read only."""
        return not self._options.read_only and self._steps.should_save(step)

    # -- save and restore ------------------------------------------------

    def save(self, step: int, items: Any = None, save_kwargs: Any = None,
             metrics: Any = None, force: bool | None = False, args: Any = None,
             custom_metadata: dict[str, Any] | None = None) -> bool:
        """Saves ``args`` at ``step`` if it is due (or ``force``); returns whether it did.

        ``custom_metadata`` is kept with the step (``metadata(step)``);
        ``items`` and ``save_kwargs`` (the legacy API) are refused. Forcing a
        step already saved raises, as in Orbax (``shardkeep.orbax.steps``).
        """
        check("CheckpointManager.save", {
            "items": Unsupported(items, None, _LEGACY),
            "save_kwargs": Unsupported(save_kwargs, None, _LEGACY),
        })
        value = items_lib.to_save(args, self._item_names)
        if self._options.read_only:
            logger.warning("%s is read only (CheckpointManagerOptions.read_only):"
                           " step %d not saved", self._manager.root, step)
            return False
        return self._steps.save(step, value, metrics=metrics, force=bool(force),
                                custom_metadata=custom_metadata)

    def restore(self, step: int | None, items: Any = None, restore_kwargs: Any = None,
                directory: Any = None, args: Any = None) -> Any:
        """Restores ``step`` (None: the latest) as ``args`` say.

        Without args every item comes back as saved: the one item of a
        manager without ``item_names``, else a Composite. ``items``,
        ``restore_kwargs`` and ``directory`` are refused.
        """
        check("CheckpointManager.restore", {
            "items": Unsupported(items, None, _LEGACY),
            "restore_kwargs": Unsupported(restore_kwargs, None, _LEGACY),
            "directory": Unsupported(directory, None, "create a manager on that directory, or"
                                     " load its step with shardkeep.load"),
        })
        load = items_lib.to_load(args, self._item_names)
        values = self._manager.load(step, load.target, partial=load.partial)
        return items_lib.loaded(load, values, self._item_names)

    # -- waiting and closing ---------------------------------------------

    def wait_until_finished(self) -> None:
        """Waits for the save in flight and the deletions it causes; raises their errors."""
        self._steps.wait()

    def close(self) -> None:
        self._steps.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._manager.__exit__(exc_type, exc, tb)
