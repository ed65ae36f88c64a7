"""Making a checkpoint's files cold or warm in the page cache, and checking it."""

from __future__ import annotations

import os
import shutil
import subprocess


def files_under(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return [os.path.join(d, name) for d, _, names in os.walk(path) for name in names]


def evict(path: str, drop_caches: bool) -> dict:
    """Makes the files under ``path`` cold: drops the whole page cache when
    asked to (root only), else evicts just these files with
    POSIX_FADV_DONTNEED. Returns the method and the bytes still resident."""
    os.sync()
    method = None
    if drop_caches:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            method = "drop_caches"
        except OSError as e:
            method = f"fadvise (drop_caches failed: {e.strerror})"
    files = files_under(path)
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return {"method": method or "fadvise", "resident_bytes": resident_bytes(files)}


def resident_bytes(files: list[str]) -> int | None:
    """Bytes of ``files`` in the page cache, from util-linux fincore."""
    if not files or shutil.which("fincore") is None:
        return None
    total = 0
    for start in range(0, len(files), 500):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES"]
                             + files[start:start + 500], capture_output=True, text=True)
        if out.returncode != 0:
            return None
        total += sum(int(v) for v in out.stdout.split())
    return total


def warm(path: str) -> None:
    buffer = bytearray(8 << 20)
    for name in files_under(path):
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
