"""Moving bytes between the processes of a job through JAX collectives.

``exchange_bytes`` is the one primitive that load-and-broadcast and the
local tier's peer copies are built on. It is collective: every process of
the job calls it, in the same order, even with nothing to send.

How it works:

1. Sizes travel through JAX's coordination service: each process publishes
   the lengths of the buffers it sends to each destination, and reads every
   other process's list, so every process knows the whole matrix of who
   sends how much to whom, and each receiver how to split what it gets.
2. Bytes travel through ``ppermute`` over a mesh of one device per process
   (the lowest-numbered device of each): for each shift d = 1..n-1 that
   carries anything, process p sends what it has for p+d (mod n) and
   receives from p-d. A shift moves the same number of bytes on every
   process, the most any of them sends, cut into rounds of at most
   ``ROUND_BYTES`` (the last one padded to a power of two, so that a few
   compiled functions serve every size) to bound the memory a round holds. An
   all-to-all written as n-1 permutations moves each byte once, directly
   from its sender to its receiver; shifts with nothing to send are skipped,
   so the common patterns (a ring: one shift; replicas of one box: a few)
   cost one collective each.

Every exchange has a name that every process passes identically (the
load and batch, the local step it copies); the processes agree on its id
by that name (``distributed.agree``), so an exchange that some processes
do not make fails at once for those that do, naming the others, and the
later exchanges are unaffected.

The bytes are uint8 end to end, so the exchange is bit-exact whatever the
buffers hold. On accelerators they go host -> device -> interconnect
(NCCL, ICI) -> device -> host; on CPU, JAX's gloo collectives carry them,
which must be chosen before ``jax.distributed.initialize``:
``jax.config.update("jax_cpu_collectives_implementation", "gloo")``.
"""

from __future__ import annotations

import functools
import json
from typing import Mapping, Sequence

import jax
import numpy as np

from . import distributed
from ..base import host_memory
from ..errors import InvalidArgumentError, ShardkeepError

# The most bytes one process sends in one round of one shift.
ROUND_BYTES = 64 << 20
# The least a round is padded to: tiny exchanges share one compiled function.
MIN_ROUND_BYTES = 64 << 10
_DEFAULT_TIMEOUT_S = 600.0


def exchange_bytes(outgoing: Mapping[int, Sequence[np.ndarray]], *, name: str,
                   into: Mapping[int, Sequence[np.ndarray]] | None = None,
                   timeout_s: float = _DEFAULT_TIMEOUT_S) -> dict[int, list[np.ndarray]]:
    """Sends each destination its buffers; returns what others sent here.

    ``name`` says which exchange this is, identically on every process
    (e.g. "load of /ckpt/7/state, batch 2"): the processes agree on it
    before any byte moves.

    ``outgoing`` maps a destination process index to a list of contiguous
    buffers (any dtype; sent as their bytes). The result maps every source
    process that sent this process at least one buffer to its buffers as
    1-D uint8 arrays, in the order sent; a process's buffers to itself come
    back as they are. ``into`` may name, per source, the contiguous buffers
    its buffers are received into (one each, of the same sizes, in order):
    the bytes then go straight there and those buffers are returned; if they
    do not match what the source sends, fresh ones are returned instead.
    ``timeout_s`` bounds each wait for the other processes (a process that
    never calls fails the others after it, naming it).
    """
    count, me = jax.process_count(), jax.process_index()
    sends = _checked(outgoing, count)
    incoming: dict[int, list[np.ndarray]] = {}
    if sends[me]:
        incoming[me] = sends[me]
    if count == 1:
        return incoming
    operation = distributed.agree("exchange", name, timeout_s)
    sizes = _agree_sizes(operation, me, count, [[b.size for b in bufs] for bufs in sends],
                         timeout_s)
    for shift in range(1, count):
        widest = max(sum(sizes[p][(p + shift) % count]) for p in range(count))
        if widest == 0:
            continue
        source = (me - shift) % count
        expected = sizes[source][me]
        destinations = _destinations(into, source, expected)
        _permute_stream(sends[(me + shift) % count], destinations, widest, shift, count,
                        operation)
        if expected:
            incoming[source] = destinations
    return incoming


def _destinations(into: Mapping[int, Sequence[np.ndarray]] | None, source: int,
                  lengths: list[int]) -> list[np.ndarray]:
    """Where the buffers from ``source`` go: the caller's when they match the
    lengths the source announced, else fresh memory on huge pages
    (first-touch page faults, not copies, dominate filling fresh buffers on
    virtual machines: host_memory.py). A mismatch is not raised here: this
    process must still take part in the collective, and the caller, who
    knows what the buffers mean, names the difference."""
    given = [] if into is None else [np.asarray(b) for b in into.get(source, [])]
    if [b.nbytes for b in given] == list(lengths) and all(
            b.flags.c_contiguous and b.flags.writeable for b in given):
        return [b.reshape(-1).view(np.uint8) for b in given]
    stream = host_memory.empty((sum(lengths),), np.uint8)
    ends = np.cumsum(lengths, dtype=np.int64)
    return [stream[end - n:end] for n, end in zip(lengths, ends)]


def _checked(outgoing: Mapping[int, Sequence[np.ndarray]], count: int) -> list[list[np.ndarray]]:
    """The buffers for each destination as 1-D uint8 views."""
    sends: list[list[np.ndarray]] = [[] for _ in range(count)]
    for dest, buffers in outgoing.items():
        if isinstance(dest, bool) or not isinstance(dest, (int, np.integer)) \
                or not 0 <= dest < count:
            raise InvalidArgumentError(
                f"exchange destination {dest!r} is not a process index of this"
                f" {count}-process job")
        for buffer in buffers:
            array = np.asarray(buffer)
            if not array.flags.c_contiguous:
                raise InvalidArgumentError("exchange buffers must be C-contiguous arrays")
            sends[int(dest)].append(array.reshape(-1).view(np.uint8))
    return sends


def _agree_sizes(operation: str, me: int, count: int, mine: list[list[int]],
                 timeout_s: float) -> list[list[list[int]]]:
    """sizes[p][q]: the lengths of the buffers process p sends process q."""
    coordination = distributed.coordination()
    key = f"{operation}/sizes"
    coordination.set(f"{key}/{me}", json.dumps(mine))
    sizes = []
    for p in range(count):
        text = json.dumps(mine) if p == me else coordination.get(f"{key}/{p}", timeout_s)
        sizes.append(json.loads(text))
    return sizes


def _permute_stream(buffers: list[np.ndarray], destinations: list[np.ndarray], widest: int,
                    shift: int, count: int, operation: str) -> None:
    """Sends the concatenation of ``buffers`` to process me+shift and
    receives what process me-shift sends into ``destinations``, in rounds."""
    # 64-byte aligned, so that the CPU client adopts it without a copy.
    send_buffer = host_memory.empty((_round_size(widest),), np.uint8)
    outgoing, incoming = _Pieces(buffers), _Pieces(destinations)
    start = 0
    while start < widest:
        # Full rounds, then one just large enough for the rest.
        send_round = send_buffer[:_round_size(widest - start)]
        filled = outgoing.copy_into(send_round)
        send_round[filled:] = 0
        incoming.copy_from(_permute(send_round, shift, count, operation))
        start += send_round.size


def _round_size(widest: int) -> int:
    size = MIN_ROUND_BYTES
    while size < min(widest, ROUND_BYTES):
        size *= 2
    return size


class _Pieces:
    """Walks a list of buffers as one stream, a round at a time."""

    def __init__(self, buffers: list[np.ndarray]):
        self._buffers, self._index, self._offset = buffers, 0, 0

    def copy_into(self, dst: np.ndarray) -> int:
        """Copies the stream's next bytes into ``dst``; returns how many."""
        return self._walk(dst, lambda piece, part: part.__setitem__(slice(None), piece))

    def copy_from(self, src: np.ndarray) -> int:
        """Copies ``src`` (or as much as the stream still holds) into the
        stream's next bytes; returns how many."""
        return self._walk(src, lambda piece, part: piece.__setitem__(slice(None), part))

    def _walk(self, other: np.ndarray, copy) -> int:
        done = 0
        while done < other.size and self._index < len(self._buffers):
            buffer = self._buffers[self._index]
            n = min(other.size - done, buffer.size - self._offset)
            copy(buffer[self._offset:self._offset + n], other[done:done + n])
            done += n
            self._offset += n
            if self._offset == buffer.size:
                self._index, self._offset = self._index + 1, 0
        return done


def _permute(send: np.ndarray, shift: int, count: int, operation: str) -> np.ndarray:
    """One round: ``send`` goes to process me+shift; returns what me-shift sent."""
    mesh = _mesh()
    me = jax.process_index()
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("p"))
    try:
        local = jax.device_put(send[None], mesh.devices[me])
        stacked = jax.make_array_from_single_device_arrays((count, send.size), sharding, [local])
        moved = _permutation(mesh, shift, send.size)(stacked)
        return np.asarray(moved.addressable_data(0)).reshape(-1)
    except Exception as e:  # noqa: BLE001 - XLA raises its own runtime errors.
        hint = ""
        if jax.default_backend() == "cpu":
            hint = ("; CPU jobs need gloo collectives, chosen before"
                    " jax.distributed.initialize: jax.config.update("
                    "\"jax_cpu_collectives_implementation\", \"gloo\")")
        raise ShardkeepError(
            f"exchange '{operation}': sending {send.size} bytes to process {(me + shift) % count}"
            f" and receiving from process {(me - shift) % count} through JAX collectives"
            f" failed: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
            f"{hint}") from e


@functools.lru_cache(maxsize=None)
def _mesh() -> jax.sharding.Mesh:
    """One device per process (its lowest-numbered), in process order."""
    firsts: dict[int, jax.Device] = {}
    for device in jax.devices():
        held = firsts.get(device.process_index)
        if held is None or device.id < held.id:
            firsts[device.process_index] = device
    return jax.sharding.Mesh(np.array([firsts[p] for p in sorted(firsts)]), ("p",))


@functools.lru_cache(maxsize=64)
def _permutation(mesh: jax.sharding.Mesh, shift: int, size: int):
    count = mesh.devices.size
    pairs = [(p, (p + shift) % count) for p in range(count)]
    spec = jax.sharding.PartitionSpec("p")
    del size  # part of the cache key: one compiled function per round size
    return jax.jit(jax.shard_map(lambda x: jax.lax.ppermute(x, "p", pairs), mesh=mesh,
                                 in_specs=spec, out_specs=spec))
