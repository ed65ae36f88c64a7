"""A one-line progress report for conversions.

Shown only when standard error is a terminal, so that logs and CI output
stay clean; rewritten in place (carriage return) at most a few times a
second, so that reporting never costs a conversion noticeable time.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

_MIN_INTERVAL_S = 0.2


class Progress:
    """Counts leaves and bytes done out of known totals; thread-safe."""

    def __init__(self, label: str, total_leaves: int, total_bytes: int,
                 stream: TextIO | None = None):
        self._label = label
        self._total_leaves, self._total_bytes = total_leaves, total_bytes
        self._leaves = self._bytes = 0
        self._stream = sys.stderr if stream is None else stream
        self._enabled = _is_terminal(self._stream)
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last_shown = 0.0

    def advance(self, leaves: int, nbytes: int) -> None:
        """Records ``leaves`` more leaves of ``nbytes`` bytes done."""
        with self._lock:
            self._leaves += leaves
            self._bytes += nbytes
            now = time.monotonic()
            if self._enabled and now - self._last_shown >= _MIN_INTERVAL_S:
                self._last_shown = now
                self._show(final=False)

    def finish(self) -> None:
        """Shows the final line and ends it (terminal only)."""
        with self._lock:
            if self._enabled:
                self._show(final=True)

    def _show(self, final: bool) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        percent = 100.0 * self._bytes / self._total_bytes if self._total_bytes else 100.0
        line = (f"\r{self._label}: {self._leaves}/{self._total_leaves} leaves,"
                f" {_mib(self._bytes)}/{_mib(self._total_bytes)} MiB ({percent:.0f}%),"
                f" {_mib(self._bytes / elapsed)} MiB/s")
        self._stream.write(line + ("\n" if final else ""))
        self._stream.flush()


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):.1f}"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
