"""One step for all processes from the primary's decision, without a per-step round trip.

Decisions that depend on a clock or on when a save was seen to commit
(``ContinuousCheckpointingPolicy``) would differ between processes: their
clocks disagree, and each learns of a commit at its own moment. So only
the primary process decides, and the step it decides on is agreed in
*rounds*, carried by background threads through JAX's coordination
service, so the training loop never waits for the service in the usual
case:

1. The primary's loop, at step ``t``, gets a yes from its policy: it opens
   round r (key ``<prefix>/<r>/open``) and records ``t`` as its step.
2. Each other process's agent thread sees the round open and records the
   step its loop has reached, ``x_i`` (``<prefix>/<r>/step/<i>``).
3. The primary's agent thread reads every ``x_i`` and announces the round's
   step ``N = max(t, x_i...) + lead`` (``<prefix>/<r>/at``).
4. Every process saves at the first step ``>= N`` its loop reaches.

Why no process can pass ``N`` unknowingly: before a process has recorded
its step, the step it will record is at least the one its loop is at, so
``N`` lies ahead; once it has recorded ``x_i``, ``N >= x_i + lead``, and
its loop waits for the announcement only if it reaches ``x_i + lead``
before the announcement arrives (the agent records ``x_i`` under the lock
the loop takes to read it). With ``lead`` a few steps and the loops kept
in step by the training's own collectives, that wait does not happen in
practice; it is bounded by ``timeout_s`` and fails naming the round.

Nothing polls: an agent waits for a key with a get that runs on a waiter
thread (``shardkeep.job.waiters``) while the agent waits on the
agreement's condition, which the get's end and ``close`` both notify. So
an idle agent makes one request per ``timeout_s``, and ``close`` stops it
at once, leaving the get (which cannot be woken) to end on its own.

In a one-process job the policy's yes is the decision (``Immediate``).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import jax

from ..errors import TimeoutError
from ..job import distributed, waiters

logger = logging.getLogger("shardkeep")


def of_job(prefix: str, *, lead: int, timeout_s: float) -> "Immediate | StepAgreement":
    """The agreement of this job's processes under key ``prefix``: a
    ``StepAgreement``, or ``Immediate`` in a one-process job."""
    if jax.process_count() == 1:
        return Immediate()
    return StepAgreement(distributed.coordination(), prefix, lead=lead, timeout_s=timeout_s)


class Immediate:
    """One process: the primary's yes is the decision at once."""

    pending = False

    def due(self, step: int, primary_says: Callable[[], bool]) -> bool:
        return primary_says()

    def close(self) -> None:
        pass


class StepAgreement:
    """Agrees the steps the primary's decisions land on (module docstring)."""

    def __init__(self, bridge, prefix: str, *, lead: int, timeout_s: float):
        self._bridge = bridge
        self._prefix = prefix
        self._lead = lead
        self._timeout_s = timeout_s
        self._me = bridge.process_index
        self._count = bridge.process_count
        self._changed = threading.Condition()  # guards the fields below
        self._reached: int | None = None       # the step the loop is at
        self._opened = 0                       # rounds opened (primary) or recorded
        self._recorded: dict[int, int] = {}    # round -> this process's step
        self._at: dict[int, int] = {}          # round -> the agreed step
        self._next = 0                         # the round the loop saves next
        self._stopping = False
        self._agent = threading.Thread(target=self._run_agent, daemon=True,
                                       name=f"shardkeep-agreement-{prefix.rsplit('/', 1)[-1]}")
        self._agent.start()

    @property
    def pending(self) -> bool:
        """A round is open: a save is decided but not yet made."""
        with self._changed:
            return self._next < self._opened

    def due(self, step: int, primary_says: Callable[[], bool]) -> bool:
        """Whether the loop saves ``step`` for an agreed decision.

        ``primary_says`` is asked on the primary when no round is open.
        """
        with self._changed:
            self._reached = step
        if self._me == 0 and not self.pending and primary_says():
            self._open(step)
        with self._changed:
            r = self._next
            recorded = self._recorded.get(r)
            if recorded is None:
                return False  # the step this process will record is >= step
            if r not in self._at:
                if step < recorded + self._lead:
                    return False
                self._wait_for(r, step)
            if step < self._at[r]:
                return False
            self._next += 1
            return True

    def close(self) -> None:
        """Stops the agent, leaving no process waiting on this one.

        A process whose loop is behind may still need the step of a round
        this one took part in: the primary announces every round it
        opened first (it needs every other process's step for that), and
        another process records its last step for the next round at once,
        whether or not that round is open yet (a later round then lands
        after its end, where the loops that go on do not reach it either).
        """
        if self._me == 0:
            with self._changed:
                if not self._changed.wait_for(lambda: len(self._at) >= self._opened,
                                              self._timeout_s):
                    logger.error("closing: save decision %s was not agreed within %g s",
                                 self._key(len(self._at)), self._timeout_s)
        else:
            self._record_step(self._opened)
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        # The agent wakes at once (``_read`` waits on this condition), so
        # the bound is for a set to the service that hangs.
        self._agent.join(self._timeout_s)

    # -- internals -------------------------------------------------------

    def _key(self, r: int, *parts: object) -> str:
        return "/".join([self._prefix, str(r), *map(str, parts)])

    def _open(self, step: int) -> None:
        with self._changed:
            r = self._opened
            self._recorded[r] = step
            self._opened += 1
            self._changed.notify_all()
        self._bridge.set(self._key(r, "open"), str(step))

    def _wait_for(self, r: int, step: int) -> None:
        """Waits (holding the condition) for round ``r``'s step."""
        if not self._changed.wait_for(lambda: r in self._at or self._stopping,
                                      self._timeout_s) or r not in self._at:
            raise TimeoutError(
                f"step {step}: the step of save decision {self._key(r)} was not announced by"
                f" process 0 within {self._timeout_s:g} s (is it alive?)")

    def _run_agent(self) -> None:
        try:
            r = 0
            while not self._stopped():
                if self._me == 0:
                    self._announce(r)
                else:
                    self._follow(r)
                r += 1
        except _Stopped:
            return
        except Exception:  # noqa: BLE001 - the loop's wait reports it by timing out
            logger.exception("the save-decision agreement %s stopped", self._prefix)

    def _announce(self, r: int) -> None:
        with self._changed:
            # ``_open`` and ``close`` notify: no timeout, no idle wake-ups.
            self._changed.wait_for(lambda: self._opened > r or self._stopping)
            if self._opened <= r:
                raise _Stopped
            at = self._recorded[r]
        for i in range(1, self._count):
            at = max(at, int(self._read(self._key(r, "step", i))))
        at += self._lead
        self._bridge.set(self._key(r, "at"), str(at))
        self._agreed(r, at)

    def _follow(self, r: int) -> None:
        self._read(self._key(r, "open"))
        self._record_step(r)
        self._agreed(r, int(self._read(self._key(r, "at"))))

    def _record_step(self, r: int) -> None:
        """Records (once: the agent and ``close`` may both try) the step the
        loop has reached as this process's step of round ``r``."""
        with self._changed:
            if r in self._recorded:
                return
            reached = self._reached if self._reached is not None else -1
            self._recorded[r] = reached
            self._opened = r + 1
        self._bridge.set(self._key(r, "step", self._me), str(reached))

    def _agreed(self, r: int, at: int) -> None:
        with self._changed:
            self._at[r] = at
            self._changed.notify_all()

    def _read(self, key: str) -> str:
        """The key's value, waiting as long as it takes, until ``close``.

        The service's get cannot be woken, so it runs on a waiter thread
        while the agent waits on the condition, which the get's end and
        ``close`` both notify: the agent wakes when the key arrives or at
        once when the agreement closes, leaving the get to end on its own.
        A get lasts ``timeout_s`` and is made again when it expires with
        no key: that is no poll, since the key's arrival ends it at once;
        the timeout bounds how long an abandoned get outlives ``close``.
        """
        while True:
            if self._stopped():
                raise _Stopped
            get = waiters.start(self._bridge.get, key, self._timeout_s, on_end=self._wake)
            with self._changed:
                self._changed.wait_for(lambda: get.ended or self._stopping)
                if not get.ended:
                    raise _Stopped
            try:
                return get.outcome()
            except TimeoutError:
                continue

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _stopped(self) -> bool:
        with self._changed:
            return self._stopping


class _Stopped(Exception):
    """The agreement is closing."""
