"""Preemption notices: "should this step be saved because the job must stop?"

Two sources, chosen once when the watch is created:

* JAX's preemption sync point, when ``jax.distributed`` started JAX's
  preemption sync manager (the default of multi-process jobs). Its C++
  notifier owns SIGTERM; when any process receives it, all processes agree
  on one step, and ``reached`` turns True at that step on every process.
  No Python handler is installed then: it would replace JAX's.
* Otherwise, in a single-process job, a Python SIGTERM handler that sets a
  flag and then calls the handler installed before it, if that one was a
  Python function.

A multi-process job without JAX's sync manager cannot agree on a step, so
the watch never reports a preemption there and says so in the log.
Once ``reached`` has returned True it stays True for every later step.
"""

from __future__ import annotations

import logging
import signal
import threading

import jax

logger = logging.getLogger("shardkeep")


def _jax_sync_manager():
    """JAX's preemption sync manager, or None (private JAX state, read here only)."""
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - depends on the installed JAX
        logger.warning("this JAX has no jax._src.distributed; JAX preemption notices are ignored")
        return None
    state = distributed.global_state
    if getattr(state, "client", None) is None:
        return None
    return getattr(state, "preemption_sync_manager", None)


class PreemptionWatch:
    """Tells, step by step, whether the job has been asked to stop.

    Thread-safety: ``reached`` must be called from one thread (the training
    loop); the SIGTERM flag may be set from the signal handler at any time.
    """

    def __init__(self):
        self._signalled = threading.Event()
        self._latched_step: int | None = None
        self._last_answer: tuple[int, bool] | None = None
        self._previous_handler = None
        self._installed = False
        if _jax_sync_manager() is not None:
            self.source = "jax"
        elif jax.process_count() > 1:
            self.source = "none"
            logger.warning(
                "multi-process job without JAX's preemption sync manager"
                " (jax_enable_preemption_service is off): preemption notices are ignored")
        elif threading.current_thread() is not threading.main_thread():
            self.source = "none"
            logger.warning("CheckpointManager created outside the main thread: no SIGTERM"
                           " handler installed, preemption notices are ignored")
        else:
            self.source = "sigterm"
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True

    def reached(self, step: int) -> bool:
        """True when ``step`` is to be saved because the job is being preempted."""
        if self._latched_step is not None:
            return True
        if self._last_answer is not None and self._last_answer[0] == step:
            return self._last_answer[1]
        if self.source == "jax":
            from jax.experimental import multihost_utils
            answer = multihost_utils.reached_preemption_sync_point(step)
        else:
            answer = self._signalled.is_set()
        self._last_answer = (step, answer)
        if answer:
            self._latched_step = step
            logger.warning("preemption notice (%s): step %d is saved and is the last one",
                           self.source, step)
        return answer

    def close(self) -> None:
        """Restores the SIGTERM handler found at creation, if ours is still installed."""
        if self._installed and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            previous = self._previous_handler
            # None: the earlier handler was installed from C and cannot be put back.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        self._installed = False

    def _on_sigterm(self, signum, frame) -> None:
        self._signalled.set()
        if callable(self._previous_handler):
            self._previous_handler(signum, frame)
