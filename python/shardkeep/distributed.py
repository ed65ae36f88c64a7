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
on the main thread (a save's blocking phase waits at a barrier there) they
run on a helper thread while the main thread waits for it, which Ctrl-C
interrupts; the abandoned call ends on its own within its timeout.

Barriers name the processes that did not arrive: before waiting, each
process records ``<barrier>/arrived/<process_index>`` in the key-value store;
when the wait fails, the arrivals are listed and the missing processes named
in the error.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax

from . import _core
from .errors import AlreadyExistsError, ShardkeepError, TimeoutError

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
        # Everyone arrived, so no process will list the arrivals: keep the
        # service's store from growing by a key per process and save.
        delete = getattr(self._client, "key_value_delete", None)
        if delete is not None:
            try:
                delete(arrived)
            except Exception:  # noqa: BLE001 - best effort.
                pass

    def _missing(self, key: str) -> list[int] | None:
        """The processes without an arrival record for barrier ``key``."""
        try:
            entries = self._client.key_value_dir_get(f"{key}/arrived/")
        except Exception:  # noqa: BLE001 - the service may be gone.
            return None
        arrived = set()
        for name, _ in entries:
            tail = name.rsplit("/", 1)[-1]
            if tail.isdigit():
                arrived.add(int(tail))
        return [p for p in range(self.process_count) if p not in arrived]

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
