"""Blocking calls run on reused threads, not on a thread started per call.

Some calls cannot be woken once they start: JAX's coordination client
(``wait_at_barrier``, ``blocking_key_value_get``) does not return to
Python until the call ends or its own timeout expires, so a thread blocked
in one neither runs signal handlers nor notices that its caller has given
up. ``start`` runs such a call on a *waiter*, a daemon thread, and the
caller waits for it on a lock the waiter releases (``Call.wait``), or
waits on a condition that the call's ``on_end`` and something else (a
``close``) both notify.

Interrupts: waiters block every signal, so none of them takes a signal
sent to the process. Python runs handlers only on the main thread, and a
signal the main thread takes interrupts its lock acquire at once; but
Linux may hand the signal to another thread of the process instead (a
test saw it taken elsewhere, with the sender blocking signals: a JAX
process has many threads that block none), and then nothing wakes the
main thread. So ``Call.wait`` waits in slices of
``_HANDLER_CHECK_S``, a local lock acquire with no request to anyone,
after each of which the handler of a signal taken elsewhere runs and its
exception (KeyboardInterrupt) propagates. The abandoned call goes on
until it ends on its own.

Reuse: a waiter serves calls one after another and waits for the next on
a queue; a call is given to an idle waiter, and a waiter is started only
when none is idle. A waiter whose call was abandoned is not idle until the
call ends, so the next call gets another. (concurrent.futures pools are
unsuitable: their workers are joined at interpreter exit, and an
abandoned call may block until its timeout, holding the exit.)
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from typing import Any, Callable

THREAD_NAME = "shardkeep-coordination-call"

# How long a signal taken by a thread other than the main one may wait
# for its handler to run (module docstring).
_HANDLER_CHECK_S = 0.1


class Call:
    """One call on a waiter."""

    def __init__(self, fn: Callable[..., Any], args: tuple,
                 on_end: Callable[[], None] | None):
        self._fn, self._args, self._on_end = fn, args, on_end
        self._outcome: tuple[bool, Any] | None = None  # (returned, value or exception)
        self._ended = threading.Lock()
        self._ended.acquire()  # released by the waiter once the call ended

    @property
    def ended(self) -> bool:
        return self._outcome is not None

    def wait(self) -> Any:
        """The call's value, or its exception raised, once it ended.

        Signal handlers run while it waits (module docstring), and their
        exception propagates from here, leaving the call running.
        """
        while not self._ended.acquire(timeout=_HANDLER_CHECK_S):
            pass
        self._ended.release()
        return self.outcome()

    def outcome(self) -> Any:
        """The ended call's value, or its exception raised."""
        assert self._outcome is not None, "the call has not ended"
        returned, value = self._outcome
        if not returned:
            raise value
        return value

    def _execute(self) -> None:
        try:
            self._outcome = (True, self._fn(*self._args))
        except BaseException as e:  # noqa: BLE001 - raised to the caller by outcome()
            self._outcome = (False, e)

    def _announce_end(self) -> None:
        self._ended.release()
        if self._on_end is not None:
            self._on_end()


class _Waiters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = 0  # waiters waiting on the queue and not yet promised a call
        self._calls: queue.SimpleQueue[Call] = queue.SimpleQueue()

    def submit(self, call: Call) -> None:
        with self._lock:
            start_one = self._idle == 0
            if not start_one:
                self._idle -= 1  # that waiter takes this call
        if start_one:
            threading.Thread(target=self._serve, daemon=True, name=THREAD_NAME).start()
        self._calls.put(call)

    def _serve(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            call = self._calls.get()
            call._execute()
            # Idle before the end is announced: a caller that makes its next
            # call as soon as this one ended finds this waiter idle.
            with self._lock:
                self._idle += 1
            call._announce_end()


_waiters = _Waiters()


def _forget_waiters() -> None:
    """A forked child has none of its parent's threads."""
    global _waiters
    _waiters = _Waiters()


os.register_at_fork(after_in_child=_forget_waiters)


def start(fn: Callable[..., Any], *args: Any,
          on_end: Callable[[], None] | None = None) -> Call:
    """Starts ``fn(*args)`` on a waiter; ``on_end`` (if given) is called on
    the waiter once it ended, after ``Call.ended`` became true."""
    call = Call(fn, args, on_end)
    _waiters.submit(call)
    return call


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run on a waiter and waited for interruptibly (``Call.wait``)."""
    return start(fn, *args).wait()
