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
on the main thread they run on a reused waiter thread (``waiters``) while
the main thread waits for it, a wait that Ctrl-C interrupts; the
abandoned call ends on its own within its timeout.

Barriers name the processes that did not arrive: before waiting, each
process records ``<barrier>/arrived/<process_index>`` in the key-value store;
when the wait fails, the arrivals are listed and the missing processes named
in the error.

Operation ids are agreed, never counted (``agree``): every collective
operation (a save, a manager's first listing, a byte exchange, a local-tier
restore) runs under an id that the processes agree on by its kind and
subject before they start. The agreement is the core's
(cpp/include/shardkeep/operation_ids.h, which gives its steps): it runs on
this job's ``_core.Coordinator``, whose key listing and best-effort delete
(``keys``, ``delete`` below) let it name the processes that did not join and
remove the keys of finished agreements. One ``_core.OperationIds`` per JAX
client holds this process's record of the verdicts it has seen, so a new
``jax.distributed.initialize`` starts afresh.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple

import jax

from .. import _core
from ..errors import AlreadyExistsError, ShardkeepError, TimeoutError
from . import waiters

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
    if jax.process_count() == 1:
        return None
    return _job().coordinator


def agree(kind: str, subject: str, timeout_s: float) -> str:
    """The agreed id of this process's next collective ``kind`` of ``subject``
    (see "Operation ids" above); "" in a single-process job.

    Raises shardkeep.TimeoutError, naming the operation and the processes
    that did not join, when they do not all make this call within
    ``timeout_s`` seconds.
    """
    if jax.process_count() == 1:
        return ""
    return _job().operation_ids.agree(kind, subject, timeout_s)


def coordination() -> "JaxCoordination":
    """Barriers and key-value operations of this multi-process job, with
    shardkeep's errors and timeouts (for the manager and tests)."""
    return JaxCoordination(_client(), jax.process_index(), jax.process_count())


def core_coordinator(bridge: "JaxCoordination") -> "_core.Coordinator":
    """``bridge``'s operations as the core's Coordinator."""
    return _core.callback_coordinator(bridge.process_index, bridge.process_count,
                                      bridge.barrier, bridge.set, bridge.get, bridge.try_get,
                                      bridge.keys, bridge.delete)


class _Job(NamedTuple):
    """The core's view of one JAX client: made once per client, since the
    operation ids keep the record of the verdicts this process has seen."""

    client: Any
    coordinator: _core.Coordinator
    operation_ids: _core.OperationIds


_jobs_lock = threading.Lock()
_current: _Job | None = None


def _job() -> _Job:
    global _current
    client = _client()
    with _jobs_lock:
        if _current is None or _current.client is not client:
            core = core_coordinator(
                JaxCoordination(client, jax.process_index(), jax.process_count()))
            _current = _Job(client, core, _core.OperationIds(core))
        return _current


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
    return waiters.call(call, *args)


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
        self.delete(arrived)

    def delete(self, key: str) -> None:
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
            names = self.keys(f"{key}/arrived/")
        except ShardkeepError:  # the service may be gone
            return None
        arrived = {int(tail) for tail in (n.rsplit("/", 1)[-1] for n in names)
                   if tail.isdigit()}
        return [p for p in range(self.process_count) if p not in arrived]

    def keys(self, prefix: str) -> list[str]:
        """The keys set under ``prefix`` (whole keys)."""
        try:
            return [name for name, _ in self._client.key_value_dir_get(prefix)]
        except Exception as e:  # noqa: BLE001
            raise ShardkeepError(
                f"listing keys under '{prefix}' in JAX's coordination service failed:"
                f" {_first_line(e)}") from e

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

