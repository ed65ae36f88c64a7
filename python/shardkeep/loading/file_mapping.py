"""Loading by mapping checkpoint files instead of reading them.

A box stored raw, in the dtype the target asks for, as exactly one chunk
is already laid out as the array it becomes. Mapping the data file
(copy-on-write, MAP_PRIVATE) and viewing that byte range gives the array
without allocating memory for it or copying it: the page cache pages are
the array. On the CPU backend device_put adopts such a view (64-byte
aligned) as the device buffer. Loads then cost what reading the file costs,
without the first touches of fresh memory, which are expensive on virtual
machines (docs/DESIGN_NOTES.md, "Mapping instead of reading", has the
figures).

Every mapped byte is still checked against its chunk's checksum before the
load returns (which is also what reads a cold file in, on several threads).

A mapped array stays valid when its file is deleted (shardkeep deletes
whole checkpoints, and the file lives on until unmapped); truncating or
rewriting a data file in place while arrays map it would change or fault
them, so Options.map_files=False turns this off for storage that others
may modify.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os

import numpy as np

from .. import _core
from ..base import dtypes, host_memory
from ..errors import CorruptionError

# Verifying a cold file is reading it, by page faults (each reads ahead):
# more threads than cores keep more reads in flight; an madvise(WILLNEED)
# of every range up front does not help, as it submits the reads one range
# at a time on the calling thread (docs/DESIGN_NOTES.md, "Mapping instead
# of reading", has the figures).
_VERIFY_THREADS = 8


class FileMapper:
    """Maps the mappable boxes of one load and verifies them."""

    def __init__(self):
        self._files: dict[str, np.ndarray] = {}
        self._mapped: list[tuple] = []  # (buffer, checksum, path, file, offset)

    def map_boxes(self, reader, name: str, slots: list, buffers: dict, core_options) -> None:
        """Gives every slot whose bytes are one raw chunk a mapped buffer,
        set in ``buffers`` (slot -> numpy array); the others are left out,
        to be read.

        ``slots`` have number, path, origin, shape and dtype.
        """
        requests = [_core.ReadRequest(s.number, dtypes.name_of(s.dtype), s.origin, s.shape)
                    for s in slots]
        for slot, found in zip(slots, reader.locate(name, requests, core_options)):
            if found is None:
                continue
            if found.checksum is None:
                continue  # nothing to check it against (safetensors): read it
            if found.offset % host_memory.XLA_ALIGNMENT:
                continue  # written before chunks were aligned: XLA would copy it
            try:
                data = self._file(found.file)
            except OSError:
                continue  # missing or unreadable: the read path reports it, naming the file
            end = found.offset + found.length
            if end > data.size:
                continue  # a short file: the read path reports it
            mapped = data[found.offset:end].view(slot.dtype).reshape(slot.shape)
            buffers[slot] = mapped
            self._mapped.append((mapped, found.checksum, slot.path, found.file, found.offset))

    def verify(self) -> None:
        """Checks every mapped box against its checksum, on several threads
        (the first touches of a cold file read it from disk); raises
        CorruptionError naming the leaf and file of a mismatch."""
        if not self._mapped:
            return
        workers = min(len(self._mapped), _VERIFY_THREADS)
        # One task per thread, each taking every workers-th box, so thousands
        # of small boxes cost no more than a few thread hand-overs.
        groups = [self._mapped[i::workers] for i in range(workers)]
        with concurrent.futures.ThreadPoolExecutor(workers, "shardkeep-verify") as pool:
            sums = list(pool.map(
                lambda group: [_core.checksum(dtypes.as_bytes(m[0])) for m in group], groups))
        for group, group_sums in zip(groups, sums):
            self._check(group, group_sums)

    @staticmethod
    def _check(mapped: list[tuple], sums: list[int]) -> None:
        for (_, expected, path, file, offset), actual in zip(mapped, sums):
            if actual != expected:
                raise CorruptionError(
                    f"checksum mismatch: chunk of leaf {path!r} in {file} at offset {offset}"
                    " has changed since it was written")

    def _file(self, file: str) -> np.ndarray:
        """The whole file as uint8, mapped copy-on-write (the view keeps the
        mapping alive)."""
        data = self._files.get(file)
        if data is None:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = (np.frombuffer(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY),
                                      np.uint8) if size else np.empty(0, np.uint8))
            self._files[file] = data
        return data
