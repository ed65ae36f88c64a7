"""Multi-process jobs: shardkeep's bridge to JAX's coordination service.

This is the one module that touches JAX's distributed runtime client, which
is reachable only through a private module
(``jax._src.distributed.global_state.client``, started by
``jax.distributed.initialize``). Everything else asks ``coordinator()`` for a
``_core.Coordinator`` and passes it to the core, which calls the functions
below from its own threads (taking the GIL for each call). The client's
blocking calls (``wait_at_barrier``, ``blocking_key_value_get``) release the
GIL while they wait, so a save's background thread waiting at a barrier does
not stall the training loop's Python thread.

The client's blocking calls do not return to Python until they finish, so
on the main thread they run on a helper thread while the main thread waits
for it, which Ctrl-C interrupts; the abandoned call ends on its own within its timeout.

Barriers name the processes that did not arrive: before waiting, each
process records ``<barrier>/arrived/<process_index>`` in the key-value store;
when the wait fails, the arrivals are listed and the missing processes named
in the error.

Operation ids are agreed, never counted (``agree``). Every collective
operation (a save, a manager's first listing, a byte exchange, a local-tier
restore) is named by what every process passes to it identically: its kind
and its subject (the checkpoint path, the manager's root, the exchange's
name). Its keys and barriers live under an id that the processes agree on
in the key-value store before they start:

1. The id is ``<kind>/<hash of subject>/<n>.<a>``: the n-th occurrence of
   that kind and subject (a forced re-save of one path is its second), at
   attempt a. Each attempt has a verdict key, written once: "go" when
   every process arrived, or "void" with the processes that arrived and
   those that did not.
2. A process skips the attempts that already have a verdict ("go": an
   occurrence it took part in; "void": one abandoned before it came) and
   records its arrival at the first undecided one.
3. Process 0 waits for every arrival and writes "go"; the others wait for
   the verdict. A process that reaches its deadline (``timeout_s`` from
   its call) lists the arrivals and writes "void" (or "go", if everyone is
   there after all); the first verdict written holds for everyone.
4. "go": the operation runs under that id, used by no other operation.
   "void": a process that had arrived fails with an error naming the
   operation and the processes that did not join; one that arrived after
   the verdict moves on to the next attempt, within its own deadline.

So a process that makes a call the others do not fails within its
``timeout_s`` with that error, and no count moves: the next operation that
all processes make agrees at once. No barrier id is ever waited on twice
(JAX numbers the uses of a barrier id per process, so a reused id that
timed out once would fail or hang for good). Each process records how far
it has seen the verdicts of each kind and subject. Once every process has
read a "go", its verdict is deleted (``_leave``), so a long job does not
grow the service by a key per operation; each process's record is then
what lets it skip that occurrence. "void" verdicts stay.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any, Callable

import jax

from .. import _core
from ..errors import AlreadyExistsError, ShardkeepError, TimeoutError

# The client methods shardkeep needs (JAX 0.4.3x to 0.10 have them all);
# key_value_delete is used when present.
_REQUIRED = ("wait_at_barrier", "key_value_set", "blocking_key_value_get",
             "key_value_try_get", "key_value_dir_get")


def coordinator() -> "_core.Coordinator | None":
    """The coordinator of this job, or None in a single-process job.

    Raises ShardkeepError when the job has several processes but JAX's
    distributed runtime client is missing (``jax.distributed.initialize``
    not called) or lacks the methods shardkeep needs (another JAX version).
    """
    count = jax.process_count()
    if count == 1:
        return None
    bridge = coordination()
    return _core.callback_coordinator(bridge.process_index, count, bridge.barrier,
                                      bridge.set, bridge.get, bridge.try_get)


def agree(kind: str, subject: str, timeout_s: float) -> str:
    """The agreed id of this process's next collective ``kind`` of ``subject``
    (see "Operation ids" above); "" in a single-process job.

    Raises shardkeep.TimeoutError, naming the operation and the processes
    that did not join, when they do not all make this call within
    ``timeout_s`` seconds.
    """
    if jax.process_count() == 1:
        return ""
    return coordination().agree(kind, subject, timeout_s)


def coordination() -> "JaxCoordination":
    """Barriers and key-value operations of this multi-process job, with
    shardkeep's errors and timeouts (for the manager and tests)."""
    return JaxCoordination(_client(), jax.process_index(), jax.process_count())


def _client() -> Any:
    try:
        from jax._src.distributed import global_state
    except ImportError as e:
        raise ShardkeepError(
            f"this JAX ({jax.__version__}) has no jax._src.distributed.global_state, which"
            " shardkeep needs to coordinate a multi-process save") from e
    client = getattr(global_state, "client", None)
    if client is None:
        raise ShardkeepError(
            f"the job has {jax.process_count()} processes but JAX's distributed runtime"
            " client is not running; call jax.distributed.initialize() first")
    missing = [name for name in _REQUIRED if not callable(getattr(client, name, None))]
    if missing:
        raise ShardkeepError(
            f"JAX {jax.__version__}'s distributed runtime client lacks {missing}, which"
            " shardkeep needs to coordinate a multi-process save")
    return client


def _code(error: BaseException) -> str:
    """The status code a JAX runtime error starts with ("DEADLINE_EXCEEDED", ...)."""
    head = str(error).split(":", 1)[0].strip()
    return head if head.isupper() else ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _ms(timeout_s: float) -> int:
    return max(1, int(round(timeout_s * 1000)))


def _interruptible(call: Callable[..., Any], *args) -> Any:
    """``call(*args)``; on the main thread, waited for interruptibly (signal
    handlers run while it blocks; their exception propagates at once)."""
    if threading.current_thread() is not threading.main_thread():
        return call(*args)
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run():
        try:
            outcome["value"] = call(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread.
            outcome["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="shardkeep-coordination-call").start()
    # Short waits: the handlers run between them even if the signal was
    # delivered to another thread.
    while not done.wait(0.1):
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class JaxCoordination:
    """Barrier and key-value operations on JAX's client, with shardkeep errors.

    A barrier that times out raises shardkeep.TimeoutError (the core maps it
    to a timeout status); any other failure of the service raises
    ShardkeepError with the service's message as its cause.
    """

    def __init__(self, client, process_index: int, process_count: int):
        self._client = client
        self.process_index = process_index
        self.process_count = process_count

    def barrier(self, key: str, timeout_s: float) -> None:
        arrived = f"{key}/arrived/{self.process_index}"
        try:
            self._client.key_value_set(arrived, "1", allow_overwrite=True)
            _interruptible(self._client.wait_at_barrier, key, _ms(timeout_s))
        except Exception as e:  # noqa: BLE001 - the client raises JaxRuntimeError.
            missing = self._missing(key)
            who = (f"processes {missing} did not arrive" if missing is not None
                   else "the processes that arrived could not be listed")
            if _code(e) == "DEADLINE_EXCEEDED":
                raise TimeoutError(
                    f"barrier '{key}' timed out after {timeout_s:g} s; {who}") from e
            raise ShardkeepError(
                f"barrier '{key}' failed in JAX's coordination service ({who}):"
                f" {_first_line(e)}") from e
        # Everyone arrived, so no process will list the arrivals.
        self._forget(arrived)

    def _forget(self, key: str) -> None:
        """Deletes ``key`` if the client can, so that the service's store
        does not grow by a key per process and operation; best effort."""
        delete = getattr(self._client, "key_value_delete", None)
        if delete is not None:
            try:
                delete(key)
            except Exception:  # noqa: BLE001 - best effort.
                pass

    def _missing(self, key: str) -> list[int] | None:
        """The processes without an arrival record for barrier ``key``."""
        try:
            arrived = self._arrivals(f"{key}/arrived/")
        except Exception:  # noqa: BLE001 - the service may be gone.
            return None
        return [p for p in range(self.process_count) if p not in arrived]

    def _arrivals(self, folder: str) -> set[int]:
        """The process indices recorded under ``folder`` of the key-value store."""
        arrived = set()
        for name, _ in self._client.key_value_dir_get(folder):
            tail = name.rsplit("/", 1)[-1]
            if tail.isdigit():
                arrived.add(int(tail))
        return arrived

    def agree(self, kind: str, subject: str, timeout_s: float) -> str:
        """See ``agree``; the steps are those of the module docstring."""
        deadline = time.monotonic() + timeout_s
        base = f"shardkeep/op/{kind}/{hashlib.sha256(subject.encode()).hexdigest()[:16]}"
        n, a = _seen.get(self._client, base)
        while True:
            verdict = self.try_get(f"{base}/{n}.{a}/verdict")
            if verdict is None:
                verdict = self._join(f"{base}/{n}.{a}", deadline)
            if verdict == _GO:
                _seen.note(self._client, base, (n + 1, 0))
                self._leave(f"{base}/{n}.{a}")
                return f"{base}/{n}.{a}"
            void = json.loads(verdict)
            _seen.note(self._client, base, (n, a + 1))
            if self.process_index in void["arrived"]:
                raise TimeoutError(
                    f"{kind} of {subject!r}: processes {void['missing']} did not join it"
                    f" within {timeout_s:g} s (processes {void['arrived']} did); every process"
                    f" of the job must make the same collective calls, and this {kind} was"
                    " made by some processes only (later calls made by all are unaffected)")
            a += 1

    def _leave(self, key: str) -> None:
        """After reading attempt ``key``'s "go": deletes this process's
        arrival, and the verdict once no arrival is left. Every process
        arrived before a "go" and reads it before it deletes its arrival, so
        whoever finds none left knows every process has read the verdict; a
        long job then keeps no key per operation. ("void" verdicts stay: a
        process that has not come yet needs one to skip its attempt.)"""
        self._forget(f"{key}/arrived/{self.process_index}")
        try:
            if self._arrivals(f"{key}/arrived/"):
                return
        except Exception:  # noqa: BLE001 - best effort, like _forget.
            return
        self._forget(f"{key}/verdict")

    def _join(self, key: str, deadline: float) -> str:
        """Records this process's arrival at attempt ``key``; returns its verdict."""
        self._client.key_value_set(f"{key}/arrived/{self.process_index}", "1",
                                   allow_overwrite=True)
        try:
            if self.process_index == 0:
                for q in range(1, self.process_count):
                    self.get(f"{key}/arrived/{q}", max(0.0, deadline - time.monotonic()))
                self._decide(key, _GO)
            else:
                self.get(f"{key}/verdict", max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            arrived = sorted(self._arrivals(f"{key}/arrived/"))
            missing = [p for p in range(self.process_count) if p not in arrived]
            self._decide(key, json.dumps({"arrived": arrived, "missing": missing})
                         if missing else _GO)
        verdict = self.try_get(f"{key}/verdict")
        if verdict is None:
            raise ShardkeepError(f"the verdict of operation '{key}' vanished from JAX's"
                                 " coordination service")
        return verdict

    def _decide(self, key: str, verdict: str) -> None:
        try:
            self.set(f"{key}/verdict", verdict)
        except AlreadyExistsError:
            pass  # another process decided first; its verdict holds

    def set(self, key: str, value: str) -> None:
        try:
            self._client.key_value_set(key, value)
        except Exception as e:  # noqa: BLE001
            if _code(e) == "ALREADY_EXISTS":
                # Keys are write-once; the commit protocol relies on this to
                # settle who decides a save's outcome.
                raise AlreadyExistsError(f"key '{key}' is already set") from e
            raise ShardkeepError(
                f"setting key '{key}' in JAX's coordination service failed:"
                f" {_first_line(e)}") from e

    def get(self, key: str, timeout_s: float) -> str:
        try:
            return _interruptible(self._client.blocking_key_value_get, key, _ms(timeout_s))
        except Exception as e:  # noqa: BLE001
            if _code(e) == "DEADLINE_EXCEEDED":
                raise TimeoutError(
                    f"key '{key}' did not appear in JAX's coordination service within"
                    f" {timeout_s:g} s") from e
            raise ShardkeepError(
                f"getting key '{key}' from JAX's coordination service failed:"
                f" {_first_line(e)}") from e

    def try_get(self, key: str) -> str | None:
        try:
            return self._client.key_value_try_get(key)
        except Exception as e:  # noqa: BLE001
            if _code(e) == "NOT_FOUND":
                return None
            raise ShardkeepError(
                f"getting key '{key}' from JAX's coordination service failed:"
                f" {_first_line(e)}") from e


_GO = "go"


class _Seen:
    """How far this process has seen the verdicts of each operation name:
    {name: (occurrence, attempt)} for the current client (a new
    ``jax.distributed.initialize`` starts afresh)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._client: Any = None
        self._positions: dict[str, tuple[int, int]] = {}

    def get(self, client, name: str) -> tuple[int, int]:
        with self._lock:
            if client is not self._client:
                self._client, self._positions = client, {}
            return self._positions.get(name, (0, 0))

    def note(self, client, name: str, position: tuple[int, int]) -> None:
        with self._lock:
            if client is self._client:
                self._positions[name] = max(position, self._positions.get(name, (0, 0)))


_seen = _Seen()
