"""The machine's floors for moving the state's bytes between disk and memory.

A floor is what the best plain program moving the same bytes on the same
filesystem costs: a floor the product beats is not a floor. So the floors
that have more than one way to run (streams, threads, block sizes) try a
few and keep the fastest; ``result["configs"]`` holds every
configuration's seconds and ``result["best"]`` the winner, whose time is
``result["seconds"]``.

  write            the state's bytes written by S parallel streams, each its
                   own file with pwrite of B-byte blocks from one pre-filled
                   buffer, each file fsynced, then the folder; S x B over
                   WRITE_STREAMS x WRITE_BLOCKS ("4x64MiB" = 4 streams of
                   64 MiB writes)
  read_cold        one sequential read of the file(s) into one reused 64 MiB
  read_warm        buffer, evicted / in the page cache: the floor of a
                   reload into memory already owned and touched
  read_fresh_cold  the file(s) read into freshly allocated memory (np.empty
  read_fresh_warm  of the state's size) by T threads over disjoint ranges
                   (preadv), T in READ_THREADS: loads that must own new
                   memory (resharded loads)
  map_cold         the file(s) mapped read-only and every page touched once
  map_warm         by T threads: loads whose arrays can be the page cache
                   (a same-sharding local load maps its chunks)
  first_touch      fresh memory of the state's size written once per page,
                   then ``touched_copy_seconds``: a copy into that memory,
                   now touched (this machine's cost of new memory, apart
                   from any code); also the same touch beside memory
                   already held and of memory just freed
  memcpy           one numpy copy of a buffer of the state's size,
                   allocation included, as a staging copy has it
  device_put       one batched jax.device_put of host arrays of the leaves'
                   sizes (what JAX alone costs to make that many arrays)

The read floors read ROOT/floor/WORKLOAD/data.bin, which each of them
writes (untimed) when it is missing, so they run in any order; W7's read
the safetensors model's files instead. Cold variants evict the files from
the page cache before each configuration (page_cache.evict), warm variants
read them in first (page_cache.warm). The floors that take new memory
(write's page cache, read_fresh's buffer) take it recycled, the same for
every configuration (_recycle): on a VM what new memory costs depends on
what the machine freed just before, and first_touch reports it apart.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from page_cache import evict, files_under, warm
import workloads

MIB = 1 << 20
GIB = 1 << 30
CHUNK = 64 * MIB
PAGE = mmap.PAGESIZE
WRITE_STREAMS = (1, 2, 4, 8)
WRITE_BLOCKS = (4 * MIB, 64 * MIB)
READ_THREADS = (1, 2, 4)
MAP_THREADS = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class Floor:
    """Where one floor measurement's bytes live."""
    workload: str
    scale: str
    size: int            # bytes moved: the state's, or W7's model files'
    folder: str          # ROOT/floor/WORKLOAD: the floor's own files
    source: str | None   # W7: the model's folder, read instead of data.bin
    drop_caches: bool
    reset_peak_rss: Callable[[], bool]

    def read_path(self) -> str:
        """The file (or folder) the read floors read, written if missing."""
        if self.source is not None:
            return self.source
        path = os.path.join(self.folder, "data.bin")
        if not os.path.exists(path) or os.path.getsize(path) != self.size:
            _write_data_file(path, self.size)
        return path


def run(op: str, workload: str, scale: str, root: str, drop_caches: bool,
        reset_peak_rss: Callable[[], bool]) -> dict:
    """One floor measurement: {"bytes", "seconds", ...}."""
    if op not in OPS:
        raise ValueError(f"floor has no op {op!r}")
    folder = os.path.join(root, "floor", workload)
    source, size = None, workloads.state_bytes(workload, scale)
    if workload == "W7":  # the model's own files, as written for the loaders
        import safetensors_files
        source = safetensors_files.model_dir(root)
        size = sum(os.path.getsize(name) for name in files_under(source))
    floor = Floor(workload, scale, size, folder, source, drop_caches, reset_peak_rss)
    return {"bytes": size} | OPS[op](floor)


# --- write ---------------------------------------------------------------

def write(floor: Floor) -> dict:
    folder = os.path.join(floor.folder, "write")
    os.makedirs(folder, exist_ok=True)
    data = np.random.default_rng(0).integers(0, 256, max(WRITE_BLOCKS), dtype=np.uint8)
    configs = {}
    floor.reset_peak_rss()
    for streams in WRITE_STREAMS:
        for block in WRITE_BLOCKS:
            _settle_for_write(folder, floor.size)
            configs[f"{streams}x{block // MIB}MiB"] = write_streams(
                folder, floor.size, streams, data.data[:block])
    _settle_for_write(folder, 0)  # the last one's files go too: the reads write their own
    return _best(configs)


def _settle_for_write(folder: str, size: int) -> None:
    """The same start for every configuration: the previous one's files
    deleted and nothing of theirs dirty (os.sync), then memory recycled
    (_recycle) for this one's page cache."""
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    os.sync()
    _recycle(size)


def _recycle(size: int) -> None:
    """``size`` bytes of memory touched and freed, so that the next
    configuration's new pages are pages the kernel has just got back.

    This VM hands memory freed a while ago back to its host, and touching
    such a page again costs far more than touching one freed just now
    (0.05 against 3-7 s/GiB here; first_touch shows it). Which pages a
    configuration gets would otherwise depend on the ones before it (the
    previous configuration's freed buffer or deleted files): the first
    would lose by its place in the order (1.3 s against 0.1 s for a
    244 MiB write). With this every configuration gets recycled pages, as
    a save does after building its state: the best case, as a floor must
    be."""
    if size:
        touched = np.ones(size, np.uint8)
        del touched


def write_streams(folder: str, size: int, streams: int, block: memoryview) -> float:
    """Seconds for ``streams`` threads to write ``size`` bytes between them,
    each its own file, fsynced, then the folder fsynced. Threads suffice:
    os.pwrite and os.fsync release the GIL."""
    jobs = [(os.path.join(folder, f"stream-{i}.bin"), length)
            for i, length in enumerate(_shares(size, streams))]
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda job: _write_file(job[0], job[1], block), jobs))
    fsync_path(folder)
    return time.perf_counter() - start


def _write_file(name: str, length: int, block: memoryview) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < length:
            done += os.pwrite(fd, block[:min(len(block), length - done)], done)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str) -> None:
    """fsync of a file, or of a folder (its entries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_data_file(path: str, size: int) -> None:
    """The read floors' input, written as the write floor writes (untimed)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    block = np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8)
    _write_file(path, size, block.data)
    fsync_path(os.path.dirname(path))


# --- reads into a reused buffer -----------------------------------------

def read_cold(floor: Floor) -> dict:
    return _read_reused(floor, cold=True)


def read_warm(floor: Floor) -> dict:
    return _read_reused(floor, cold=False)


def _read_reused(floor: Floor, cold: bool) -> dict:
    """One sequential pass over the files into one 64 MiB buffer: memory
    owned and touched before the clock, as a reload into live arrays has."""
    path = floor.read_path()
    result: dict = {}
    if cold:
        result["cold"] = evict(path, floor.drop_caches)
    else:
        warm(path)
    buffer = bytearray(CHUNK)
    floor.reset_peak_rss()
    start = time.perf_counter()
    total = 0
    for name in sorted(files_under(path)):
        with open(name, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    result["seconds"] = time.perf_counter() - start
    assert total == floor.size, (total, floor.size)
    return result


# --- reads into fresh memory ---------------------------------------------

@dataclasses.dataclass(frozen=True)
class Piece:
    """A byte range of one file and where it goes in the concatenation."""
    name: str
    offset: int
    length: int
    at: int


def split_files(files: list[str], parts: int) -> list[list[Piece]]:
    """Each file cut into ``parts`` page-aligned ranges, part i of every
    file going to worker i, so that workers touch disjoint pages."""
    work: list[list[Piece]] = [[] for _ in range(parts)]
    at = 0
    for name in files:
        size = os.path.getsize(name)
        offset = 0
        for i, length in enumerate(_shares(size, parts, PAGE)):
            if length:
                work[i].append(Piece(name, offset, length, at + offset))
            offset += length
        at += size
    return work


def _shares(size: int, parts: int, align: int = 1) -> list[int]:
    """``size`` cut into ``parts`` near-equal lengths, each but the last a
    multiple of ``align``."""
    share = -(-size // parts // align) * align if size else 0
    lengths = []
    for _ in range(parts):
        lengths.append(min(share, size))
        size -= lengths[-1]
    lengths[-1] += size
    return lengths


def read_fresh_cold(floor: Floor) -> dict:
    return _read_fresh(floor, cold=True)


def read_fresh_warm(floor: Floor) -> dict:
    return _read_fresh(floor, cold=False)


def _read_fresh(floor: Floor, cold: bool) -> dict:
    """The files read into a new np.empty of their total size by T threads
    (the allocation inside the clock; its pages are first touched by the
    reads). Each configuration gets recycled memory (_recycle)."""
    path = floor.read_path()
    files = sorted(files_under(path))
    configs, colds = {}, []
    floor.reset_peak_rss()
    for threads in READ_THREADS:
        _recycle(floor.size)
        if cold:
            colds.append(evict(path, floor.drop_caches))
        else:
            warm(path)
        parts = split_files(files, threads)
        start = time.perf_counter()
        buffer = np.empty(floor.size, np.uint8)
        _in_threads(threads, _read_pieces, parts, buffer.data)
        configs[_threads_name(threads)] = time.perf_counter() - start
        del buffer
    return _best(configs) | ({"cold": _worst(colds)} if cold else {})


def _read_pieces(pieces: list[Piece], buffer: memoryview) -> None:
    for piece in pieces:
        fd = os.open(piece.name, os.O_RDONLY)
        try:
            done = 0
            while done < piece.length:
                end = piece.at + min(piece.length, done + CHUNK)
                n = os.preadv(fd, [buffer[piece.at + done:end]], piece.offset + done)
                if n == 0:
                    raise EOFError(f"{piece.name} ended at {piece.offset + done}")
                done += n
        finally:
            os.close(fd)


# --- mapped reads ----------------------------------------------------------

def map_cold(floor: Floor) -> dict:
    return _map(floor, cold=True)


def map_warm(floor: Floor) -> dict:
    return _map(floor, cold=False)


def _map(floor: Floor, cold: bool) -> dict:
    """The files mapped read-only (inside the clock) and one byte of every
    page read by T threads: the page cache becomes the arrays, so this is
    all a load that maps has to wait for. The mappings are closed after
    the clock; a load keeps them as its arrays."""
    path = floor.read_path()
    files = sorted(files_under(path))
    configs, colds = {}, []
    floor.reset_peak_rss()
    for threads in MAP_THREADS:
        if cold:
            colds.append(evict(path, floor.drop_caches))
        else:
            warm(path)
        parts, maps = split_files(files, threads), {}
        start = time.perf_counter()
        for name in files:
            if os.path.getsize(name):
                with open(name, "rb") as f:
                    maps[name] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        _in_threads(threads, _touch_pieces, parts, maps)
        configs[_threads_name(threads)] = time.perf_counter() - start
        for mapped in maps.values():
            mapped.close()
    return _best(configs) | ({"cold": _worst(colds)} if cold else {})


def _touch_pieces(pieces: list[Piece], maps: dict[str, mmap.mmap]) -> None:
    # numpy's reduction runs without the GIL, so the threads' page faults
    # overlap; the pieces are page-aligned, so the stride hits every page.
    for piece in pieces:
        np.frombuffer(maps[piece.name], np.uint8, piece.length, piece.offset)[::PAGE].max()


# --- memory ----------------------------------------------------------------

def first_touch(floor: Floor) -> dict:
    """What new memory costs on this machine, whatever the code: the state's
    size of new memory written once per page (the kernel maps and zeroes
    each page on its first touch; a VM's host may have to back it again),
    timed four ways, each also per GiB:

      seconds               the process's first such memory, as a load's
                            new arrays are
      held_seconds          the next, while the first is held, as a staging
                            copy's is beside the state (memcpy's case)
      touched_copy_seconds  a copy into the first, now touched
      recycled_seconds      new memory right after the first is freed, with
                            pages the guest still holds

    On a VM that hands freed memory back to its host, the first two depend
    on how much the machine freed just before; against the last two they
    tell the VM's share."""
    size = floor.size
    floor.reset_peak_rss()
    first, seconds = _touch_new(size)
    held, held_seconds = _touch_new(size)
    start = time.perf_counter()
    np.copyto(first, held)
    copy_seconds = time.perf_counter() - start
    del first
    again, recycled_seconds = _touch_new(size)
    del again, held
    timed = {"seconds": seconds, "held_seconds": held_seconds,
             "touched_copy_seconds": copy_seconds, "recycled_seconds": recycled_seconds}
    return timed | {f"{key}_per_gib": value * GIB / size for key, value in timed.items()}


def _touch_new(size: int) -> tuple[np.ndarray, float]:
    """A new buffer of ``size`` bytes with every page written, and the
    seconds that took."""
    start = time.perf_counter()
    buffer = np.empty(size, np.uint8)
    buffer[::PAGE] = 1
    return buffer, time.perf_counter() - start


def memcpy(floor: Floor) -> dict:
    src = np.ones(floor.size, np.uint8)
    floor.reset_peak_rss()
    start = time.perf_counter()
    dst = src.copy()
    seconds = time.perf_counter() - start
    del dst
    return {"seconds": seconds}


def device_put(floor: Floor) -> dict:
    """What JAX itself costs to make the workload's leaves jax.Arrays from
    host arrays (64-byte aligned, so the CPU client adopts them without a
    copy), in one batched call: a load can not return sooner."""
    import jax
    leaves = workloads.leaves(floor.workload, floor.scale)
    hosts = []
    for leaf in leaves:
        raw = np.empty(leaf.nbytes + 64, np.uint8)
        start_at = (-raw.ctypes.data) % 64
        hosts.append(raw[start_at:start_at + leaf.nbytes].view(np.float32))
    shardings = [workloads.sharding_for(floor.workload, leaf, "fsdp") for leaf in leaves]
    floor.reset_peak_rss()
    start = time.perf_counter()
    jax.block_until_ready(jax.device_put(hosts, shardings))
    return {"seconds": time.perf_counter() - start}


# --- helpers ---------------------------------------------------------------

def _in_threads(threads: int, work: Callable, parts: list, shared) -> None:
    """``work(part, shared)`` for every part, one thread each."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda part: work(part, shared), parts))


def _threads_name(threads: int) -> str:
    return f"{threads} thread{'s' if threads > 1 else ''}"


def _best(configs: dict[str, float]) -> dict:
    best = min(configs, key=configs.__getitem__)
    return {"seconds": configs[best], "best": best, "configs": configs}


def _worst(colds: list[dict]) -> dict:
    """One eviction record for several: the first's method, the most bytes
    any left resident (None if one could not tell)."""
    resident = [c["resident_bytes"] for c in colds]
    return {"method": colds[0]["method"],
            "resident_bytes": None if None in resident else max(resident)}


OPS: dict[str, Callable[[Floor], dict]] = {
    "write": write, "read_cold": read_cold, "read_warm": read_warm,
    "read_fresh_cold": read_fresh_cold, "read_fresh_warm": read_fresh_warm,
    "map_cold": map_cold, "map_warm": map_warm, "first_touch": first_touch,
    "memcpy": memcpy, "device_put": device_put,
}
