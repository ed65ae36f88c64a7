"""Load-and-broadcast: each box that several processes hold is read once.

In a multi-process load, a box that a target leaf places on devices of
several processes (a replicated or data-parallel mesh axis) is read from
storage by one of those processes, its *reader*, and sent to the other
holders through one collective byte exchange (``exchange.exchange_bytes``).
Storage then serves one copy of the checkpoint, whatever the number of
replicas.

Every process builds the same plan from the targets' global shardings
(``devices_indices_map``, which every process computes alike), so the
processes agree on who reads and who sends what without talking; the
exchange is the only collective. This requires what a multi-process load
requires anyway: every process passes the same target tree, with the same
shardings.

Readers are chosen to spread the reads over processes by bytes: boxes held
by one process are that process's reads; then the shared boxes, largest
first, each go to the holder with the fewest bytes so far (ties to the
lowest process index). The reader casts on read, so the bytes sent are in
the target's dtype and receivers place them as they are: the result is
bit-identical to every process reading.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from . import dtypes, exchange, host_memory, shardings
from .errors import ShardkeepError

# Bounds the bytes one process receives per exchange call (the exchange's
# own buffers come on top of the slots being filled): a larger load runs
# several exchanges, in an order every process derives from the same plan.
BATCH_BYTES = 1 << 30


class _Shared:
    """One box held by several processes, and its slot in this process."""

    __slots__ = ("path", "origin", "shape", "holders", "nbytes", "reader", "slot")

    def __init__(self, path: str, origin: tuple, shape: tuple, holders: tuple[int, ...],
                 nbytes: int, slot):
        self.path, self.origin, self.shape = path, origin, shape
        self.holders, self.nbytes, self.slot = holders, nbytes, slot
        self.reader = -1


class Plan:
    """Who reads each box of a load's jax-sharded leaves, and the exchange
    that gives the other holders their copies.

    Usage: ``add_leaf`` for every jax-sharded target leaf, in the target's
    leaf order (the same in every process); ``received_slots`` before
    reading; ``exchange`` after this process's own reads.
    """

    def __init__(self, process_index: int):
        self._me = process_index
        self._shared: list[_Shared] = []
        self._sole_bytes: collections.Counter = collections.Counter()
        self._assigned = False

    def add_leaf(self, path: str, sharding, shape: tuple, key_shape: tuple,
                 dtype: np.dtype, slots: list) -> None:
        """Registers a leaf of ``shape`` placed with ``sharding``; ``slots``
        are this process's boxes of it (origin and shape with the typed-key
        dimensions ``key_shape`` appended, as the reader reads them)."""
        holders = shardings.box_holders(sharding, shape)
        if len({p for processes in holders.values() for p in processes}) < 2:
            # The leaf lives in one process. Its sharding may differ between
            # processes (each one's default device), so it must not sway a
            # plan they all have to agree on.
            return
        key_origin = (0,) * len(key_shape)
        mine = {(slot.origin, slot.shape): slot for slot in slots}
        for (origin, extent), processes in sorted(holders.items()):
            origin, extent = origin + key_origin, extent + key_shape
            nbytes = math.prod(extent) * dtype.itemsize
            if len(processes) == 1:
                self._sole_bytes[processes[0]] += nbytes
            elif nbytes:  # an empty box costs nothing to read: every holder reads it
                self._shared.append(_Shared(path, origin, extent, processes, nbytes,
                                            mine.get((origin, extent))))

    def received_slots(self) -> set[int]:
        """The ids of this process's slots that another process reads and
        sends; the caller reads (or maps) every other slot itself."""
        self._assign()
        return {id(s.slot) for s in self._shared if s.slot is not None and s.reader != self._me}

    def exchange(self, timeout_s: float) -> None:
        """Sends the shared boxes this process read to their other holders
        and fills the slots it receives. Collective: every process calls it
        once its own reads are done (their buffers filled); ``timeout_s``
        bounds each wait for the other processes."""
        self._assign()
        for batch in self._batches():
            outgoing: dict[int, list[np.ndarray]] = collections.defaultdict(list)
            expected: dict[int, list[_Shared]] = collections.defaultdict(list)
            for box in batch:
                if box.reader == self._me:
                    data = dtypes.as_bytes(box.slot.buffer)
                    for holder in box.holders:
                        if holder != self._me:
                            outgoing[holder].append(data)
                elif box.slot is not None:
                    expected[box.reader].append(box)
            received = exchange.exchange_bytes(dict(outgoing), timeout_s=timeout_s)
            self._fill(expected, received)

    def _assign(self) -> None:
        if self._assigned:
            return
        load = collections.Counter(self._sole_bytes)
        # Largest first: the small boxes that come last even out the loads.
        for box in sorted(self._shared, key=lambda b: -b.nbytes):  # stable: plan order on ties
            box.reader = min(box.holders, key=lambda p: (load[p], p))
            load[box.reader] += box.nbytes
        self._assigned = True

    def _batches(self) -> list[list[_Shared]]:
        """The shared boxes in plan order, cut where some process would
        receive more than BATCH_BYTES in one exchange."""
        batches: list[list[_Shared]] = []
        batch: list[_Shared] = []
        incoming: collections.Counter = collections.Counter()
        for box in self._shared:
            receivers = [p for p in box.holders if p != box.reader]
            if batch and any(incoming[p] + box.nbytes > BATCH_BYTES for p in receivers):
                batches.append(batch)
                batch, incoming = [], collections.Counter()
            batch.append(box)
            for p in receivers:
                incoming[p] += box.nbytes
        if batch:
            batches.append(batch)
        return batches

    def _fill(self, expected: dict[int, list[_Shared]],
              received: dict[int, list[np.ndarray]]) -> None:
        sources, destinations = [], []
        for reader in sorted(set(expected) | set(received)):
            boxes, buffers = expected.get(reader, []), received.get(reader, [])
            if len(buffers) != len(boxes):
                raise ShardkeepError(
                    f"load-and-broadcast: process {self._me} expected {len(boxes)} boxes from"
                    f" process {reader} and received {len(buffers)}; do all processes load"
                    " the same target?")
            for box, data in zip(boxes, buffers):
                if data.dtype != np.uint8 or data.size != box.nbytes:
                    raise ShardkeepError(
                        f"load-and-broadcast: leaf {box.path!r} box at {list(box.origin)}"
                        f" shape {list(box.shape)}: process {self._me} received"
                        f" {data.nbytes} bytes from process {reader}, expected {box.nbytes};"
                        " do all processes load the same target?")
                sources.append(data.reshape(-1))
                destinations.append(dtypes.as_bytes(box.slot.buffer))
        host_memory.copy_all(sources, destinations)
