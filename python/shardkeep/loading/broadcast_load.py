"""Load-and-broadcast: each box that several processes hold is read once.

In a multi-process load, a box that a target leaf places on devices of
several processes (a replicated or data-parallel mesh axis) is read from
storage once, by its holders, and sent to the other holders through a
collective byte exchange (``exchange.exchange_bytes``). Storage then serves
one copy of the checkpoint, whatever the number of replicas.

Every process builds the same plan from the targets' global shardings
(``devices_indices_map``, which every process computes alike) and the
checkpoint's index, so the processes agree on who reads and who sends what
without talking; the exchange is the only collective. This requires what a
multi-process load requires anyway: every process passes the same target
tree, with the same shardings.

The unit of reading is a *piece*. A shared box of ``MIN_CUT_BYTES`` or
more is cut along its first dimension into one piece per holder (rows of
a C-order box: each piece is a contiguous part of the holders' buffers,
read in place and sent as it is), so that a large leaf every process
holds whole (pure data parallelism) is read by all of them, a share each.
That is also how a replica-parallel save splits the box among the
processes holding it, so a load onto the layout it was saved from reads
each stored chunk whole, in one piece. A source fetches (and the core
verifies) whole stored chunks, so a cut must not put one chunk in two
pieces (the source's ``ranges`` tells, from the index alone): when one piece per
holder would, halving the number of pieces is tried, down to the whole
box. Smaller boxes are one piece each.

Readers are chosen to spread the reads by bytes: boxes held by one process
are its own reads; then the shared boxes, those with the fewest holders
first and the largest pieces first among them, give their pieces to the
holders with the fewest bytes so far, one each (ties to the lowest process
index). The source casts on read,
so the bytes sent are in the target's dtype and receivers place them as
they are: the result is bit-identical to every process reading.
"""

from __future__ import annotations

import collections
import heapq
import math
from typing import Mapping, Sequence

import numpy as np

from .. import _core
from ..base import dtypes, host_copy, shardings
from ..job import exchange
from ..errors import ShardkeepError

# A shared box smaller than this is read whole by one holder: many small
# boxes balance among the processes well enough without the extra requests
# and exchange entries that pieces cost.
MIN_CUT_BYTES = 4 << 20
# Bounds the bytes one process receives per exchange call (the exchange's
# own buffers come on top of the slots being filled): a larger load runs
# several exchanges, in an order every process derives from the same plan.
BATCH_BYTES = 1 << 30


class _Box:
    """A box of one leaf that several processes hold, with its slot in this
    process (None where this process does not hold it)."""

    __slots__ = ("number", "path", "dtype", "origin", "shape", "holders", "nbytes", "slot")

    def __init__(self, number: int, path: str, dtype: np.dtype, origin: tuple, shape: tuple,
                 holders: tuple[int, ...], slot):
        self.number, self.path, self.dtype = number, path, dtype
        self.origin, self.shape, self.holders, self.slot = origin, shape, holders, slot
        self.nbytes = math.prod(shape) * dtype.itemsize

    def cut(self, parts: int) -> list[tuple[int, int]]:
        """The rows of ``parts`` near-equal pieces (a 0-d box has one "row")."""
        rows = self.shape[0] if self.shape else 1
        return [(rows * r // parts, rows * (r + 1) // parts) for r in range(parts)]

    def part(self, rows: tuple[int, int]) -> tuple[tuple, tuple]:
        """Origin and shape, in the leaf, of the box's rows ``rows``."""
        if not self.shape:
            return self.origin, self.shape
        start, stop = rows
        return ((self.origin[0] + start,) + self.origin[1:],
                (stop - start,) + self.shape[1:])

    def request(self, rows: tuple[int, int]) -> _core.ReadRequest:
        """A ranges request (no buffer) for the box's rows ``rows``."""
        origin, shape = self.part(rows)
        return _core.ReadRequest(self.number, dtypes.name_of(self.dtype), origin, shape)


class _Piece:
    """Rows ``start:stop`` of a shared box, and the process that reads them."""

    __slots__ = ("box", "start", "stop", "nbytes", "reader")

    def __init__(self, box: _Box, rows: tuple[int, int]):
        self.box = box
        self.start, self.stop = rows
        whole_rows = box.shape[0] if box.shape else 1
        self.nbytes = box.nbytes * (self.stop - self.start) // whole_rows
        self.reader = -1

    def buffer(self, buffers: Mapping) -> np.ndarray:
        """The piece's part of this process's slot buffer (contiguous), the
        slots' buffers being ``buffers``."""
        whole = buffers[self.box.slot]
        return whole if whole.ndim == 0 else whole[self.start:self.stop]


class Plan:
    """Who reads each piece of a load's jax-sharded leaves, and the exchange
    that gives the other holders their copies.

    The load-and-broadcast stage of the load executor, which uses it so:
    ``add_leaf`` for every jax-sharded target leaf, in the target's leaf
    order (the same in every process); ``choose_readers``; then
    ``shared_slots`` (the slots not to read whole); once every slot has a
    buffer, ``own_pieces`` to read besides the other slots; ``exchange``
    after this process's reads. The slots' buffers are the executor's,
    passed in as a mapping of slot to numpy array.
    """

    def __init__(self, process_index: int):
        self._me = process_index
        self._boxes: list[_Box] = []
        self._pieces: list[_Piece] | None = None
        self._sole_bytes: collections.Counter = collections.Counter()

    def add_leaf(self, number: int, path: str, sharding, shape: tuple, key_shape: tuple,
                 dtype: np.dtype, slots: Sequence) -> None:
        """Registers leaf ``number`` of ``shape`` placed with ``sharding``;
        ``slots`` are this process's boxes of it (origin and shape with the
        typed-key dimensions ``key_shape`` appended, as the reader reads
        them)."""
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
            box = _Box(number, path, dtype, origin, extent, processes,
                       mine.get((origin, extent)))
            if len(processes) == 1:
                self._sole_bytes[processes[0]] += box.nbytes
            elif box.nbytes:  # an empty box costs nothing to read: every holder reads it
                self._boxes.append(box)

    def choose_readers(self, source) -> None:
        """Cuts the large boxes into pieces where their stored chunks allow
        (asking ``source``, a ``load_source.Source``, for the ranges their
        reads fetch), then gives every piece a reader."""
        tries = [_cuts_to_try(box) for box in self._boxes]
        requests = [box.request(rows) for box, counts in zip(self._boxes, tries)
                    for n in counts for rows in box.cut(n)]
        fetched = iter(source.ranges(requests) if requests else [])
        parts = []
        for counts in tries:
            fits = [n for n in counts if not pieces_overlap([next(fetched) for _ in range(n)])]
            parts.append(fits[0] if fits else 1)
        cut = [[_Piece(box, rows) for rows in box.cut(n)] for box, n in zip(self._boxes, parts)]
        self._pieces = [piece for pieces in cut for piece in pieces]
        load = collections.Counter(self._sole_bytes)
        # Boxes with the fewest holders first (they have the least choice),
        # and among those the largest pieces first, so that the small and
        # the widely held ones that come last even out the loads. A box's
        # pieces go to its least loaded holders, one each. Sorting is
        # stable: ties keep the plan order, alike in every process.
        for pieces in sorted(cut, key=lambda ps: (len(ps[0].box.holders), -ps[0].nbytes)):
            readers = heapq.nsmallest(len(pieces), pieces[0].box.holders,
                                      key=lambda p: (load[p], p))
            for piece, reader in zip(pieces, readers):
                piece.reader = reader
                load[reader] += piece.nbytes

    def shared_slots(self) -> set:
        """This process's slots that it does not read whole: another
        process reads some piece of them. The caller reads (or maps) every
        other slot itself."""
        return {p.box.slot for p in self._chosen()
                if p.box.slot is not None and p.reader != self._me}

    def own_pieces(self, buffers: Mapping) -> list[tuple]:
        """(slot, origin, shape, buffer) of each piece of ``shared_slots``
        this process reads: the piece's place in its leaf, and its part of
        the slot's buffer (in ``buffers``) to read into."""
        shared = self.shared_slots()
        return [(p.box.slot, *p.box.part((p.start, p.stop)), p.buffer(buffers))
                for p in self._chosen() if p.reader == self._me and p.box.slot in shared]

    def exchange(self, buffers: Mapping, name: str, timeout_s: float) -> None:
        """Sends the pieces this process read to their other holders and
        fills the pieces it receives, in the slots' ``buffers``. Collective:
        every process calls it once its own reads are done (their buffers
        filled), with the same ``name`` (the load's); ``timeout_s`` bounds
        each wait for the other processes."""
        for number, batch in enumerate(self._batches()):
            outgoing: dict[int, list[np.ndarray]] = collections.defaultdict(list)
            expected: dict[int, list[_Piece]] = collections.defaultdict(list)
            for piece in batch:
                if piece.reader == self._me:
                    data = dtypes.as_bytes(piece.buffer(buffers))
                    for holder in piece.box.holders:
                        if holder != self._me:
                            outgoing[holder].append(data)
                elif piece.box.slot is not None:
                    expected[piece.reader].append(piece)
            # Received straight into the slot buffers: no second copy.
            into = {reader: [dtypes.as_bytes(piece.buffer(buffers)) for piece in pieces]
                    for reader, pieces in expected.items()}
            received = exchange.exchange_bytes(dict(outgoing), name=f"{name}, batch {number}",
                                               into=into, timeout_s=timeout_s)
            self._fill(buffers, expected, received)

    def _chosen(self) -> list[_Piece]:
        if self._pieces is None:
            raise AssertionError("Plan.choose_readers was not called")
        return self._pieces

    def _batches(self) -> list[list[_Piece]]:
        """The pieces in plan order, cut where some process would receive
        more than BATCH_BYTES in one exchange."""
        batches: list[list[_Piece]] = []
        batch: list[_Piece] = []
        incoming: collections.Counter = collections.Counter()
        for piece in self._chosen():
            receivers = [p for p in piece.box.holders if p != piece.reader]
            if batch and any(incoming[p] + piece.nbytes > BATCH_BYTES for p in receivers):
                batches.append(batch)
                batch, incoming = [], collections.Counter()
            batch.append(piece)
            for p in receivers:
                incoming[p] += piece.nbytes
        if batch:
            batches.append(batch)
        return batches

    def _fill(self, buffers: Mapping, expected: dict[int, list[_Piece]],
              received: dict[int, list[np.ndarray]]) -> None:
        sources, destinations = [], []
        for reader in sorted(set(expected) | set(received)):
            pieces, arrived = expected.get(reader, []), received.get(reader, [])
            if len(arrived) != len(pieces):
                raise ShardkeepError(
                    f"load-and-broadcast: process {self._me} expected {len(pieces)} pieces"
                    f" from process {reader} and received {len(arrived)}; do all processes"
                    " load the same target?")
            for piece, data in zip(pieces, arrived):
                if data.dtype != np.uint8 or data.size != piece.nbytes:
                    origin, shape = piece.box.part((piece.start, piece.stop))
                    raise ShardkeepError(
                        f"load-and-broadcast: leaf {piece.box.path!r} box at {list(origin)}"
                        f" shape {list(shape)}: process {self._me} received {data.nbytes}"
                        f" bytes from process {reader}, expected {piece.nbytes}; do all"
                        " processes load the same target?")
                destination = dtypes.as_bytes(piece.buffer(buffers))
                if _address(data) != _address(destination):  # not received in place
                    sources.append(data.reshape(-1))
                    destinations.append(destination)
        host_copy.copy_all(sources, destinations)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _cuts_to_try(box: _Box) -> list[int]:
    """The numbers of pieces to try for ``box``, best first: one per holder,
    then halvings; none (read it whole) for a small box or a 0-d one."""
    if box.nbytes < MIN_CUT_BYTES or not box.shape:
        return []
    counts, n = [], min(len(box.holders), box.shape[0])
    while n > 1:
        counts.append(n)
        n //= 2
    return counts


def pieces_overlap(pieces_ranges: list[list[tuple]]) -> bool:
    """Whether any stored byte would be fetched for two of the pieces
    (each piece: its (file, start, stop) spans)."""
    spans = sorted(span for ranges in pieces_ranges for span in _merged(ranges))
    end: dict[str, int] = {}
    for file, start, stop in spans:
        # One piece's spans are disjoint, so a span that starts before the
        # furthest end so far in its file overlaps another piece's.
        if start < end.get(file, start):
            return True
        end[file] = max(end.get(file, stop), stop)
    return False


def _merged(ranges: list[tuple]) -> list[tuple]:
    """(file, start, stop) spans covering ``ranges``, disjoint."""
    spans: list[list] = []
    for file, start, stop in sorted(ranges):
        if spans and spans[-1][0] == file and start <= spans[-1][2]:
            spans[-1][2] = max(spans[-1][2], stop)
        else:
            spans.append([file, start, stop])
    return [tuple(span) for span in spans]
