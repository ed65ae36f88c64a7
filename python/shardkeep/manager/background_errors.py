"""The errors of a manager's background work, raised by its next call.

Saves end, and retention deletes, on the save queue's thread
(``shardkeep.manager.commits``); what fails there is logged at once and
kept here until the training thread's next ``save``, ``wait`` or
``close`` raises it (docs/MANAGER.md, "Errors").
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..errors import ShardkeepError
from ..saving.save_future import SaveFuture

# A failed save as kept: what failed, the queue's message, its future's getter.
_FailedSave = tuple[str, str, Callable[[], "SaveFuture | None"]]

logger = logging.getLogger("shardkeep")


class BackgroundErrors:
    """Errors kept until they are raised; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._errors: list[BaseException | _FailedSave] = []

    def record(self, what: str, error: BaseException) -> None:
        logger.error("%s: %s", what, error)
        with self._lock:
            self._errors.append(described(error, f"{what}: {error}"))

    def failed_save(self, what: str, message: str,
                    future: Callable[[], SaveFuture | None]) -> None:
        """Keeps a failed save's error, which the queue tells its end as a
        message alone: ``future()`` (its SaveFuture, set once the save's
        start has returned to the manager) raises it with its class when
        the error is raised."""
        logger.error("%s: %s", what, message)
        with self._lock:
            self._errors.append((what, message, future))

    def raise_first(self) -> None:
        """Raises the first error kept (naming how many more), and forgets them all."""
        with self._lock:
            kept, self._errors = self._errors, []
        errors = [_typed(error) for error in kept]
        if not errors:
            return
        if len(errors) > 1:
            others = "; ".join(str(e) for e in errors[1:])
            raise described(errors[0], f"{errors[0]} (and {len(errors) - 1} more: {others})")
        raise errors[0]


def _typed(error: BaseException | _FailedSave) -> BaseException:
    if isinstance(error, BaseException):
        return error
    what, message, get_future = error
    future = get_future()
    if future is None:  # it failed before its start returned: its class is unknown
        return ShardkeepError(f"{what}: {message}")
    try:
        future.result()  # ended: raises at once
    except Exception as e:  # noqa: BLE001 - the save's error, of its own class
        return described(e, f"{what}: {e}")
    return ShardkeepError(f"{what}, yet its future reports a commit")


def described(error: BaseException, message: str) -> BaseException:
    """An error of the same class as ``error`` (when possible) saying ``message``."""
    try:
        described_error = type(error)(message)
    except Exception:  # noqa: BLE001 - classes whose constructor takes other arguments
        described_error = ShardkeepError(message)
    described_error.__cause__ = error
    return described_error
