"""HTTP/1.1 messages on a socket, for the fault proxy (s3_fault_proxy.py):
reading message heads, bodies framed by Content-Length or chunked, and
bodies that run until the connection closes; and passing a body on with
a bit flipped or cut short. Bytes are handed on as they arrive, so a
large upload or download is never held whole."""

from __future__ import annotations

import socket

_MAX_HEAD = 64 << 10


class Closed(Exception):
    """The peer closed its connection."""


class Stream:
    """Buffered reads from a socket: lines, exact lengths, chunked bodies."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise Closed()
        self.buffer += data

    def head(self) -> bytes:
        """Bytes up to and including the blank line ending a message head."""
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > _MAX_HEAD:
                raise ValueError("message head too long")
            self._fill()
        end = self.buffer.index(b"\r\n\r\n") + 4
        head, self.buffer = self.buffer[:end], self.buffer[end:]
        return head

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        end = self.buffer.index(b"\r\n") + 2
        line, self.buffer = self.buffer[:end], self.buffer[end:]
        return line

    def exactly(self, size: int, sink) -> None:
        """Passes the next ``size`` bytes to ``sink`` as they arrive."""
        while size:
            if not self.buffer:
                self._fill()
            piece, self.buffer = self.buffer[:size], self.buffer[size:]
            sink(piece)
            size -= len(piece)

    def until_close(self, sink) -> None:
        if self.buffer:
            sink(self.buffer)
            self.buffer = b""
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return
            sink(data)

    def chunked(self, sink) -> None:
        """Passes a chunked body, framing included, to ``sink``."""
        while True:
            size_line = self.line()
            sink(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = self.line()
                    sink(trailer)
                    if trailer == b"\r\n":
                        return
            self.exactly(size + 2, sink)


def parse_head(head: bytes) -> tuple[list[str], dict[str, str]]:
    """The first line's words and the headers (names in lower case)."""
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return first, headers


def body_framing(headers: dict[str, str]) -> tuple[str, int]:
    """("chunked", 0) or ("length", the Content-Length, 0 when absent)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked", 0
    return "length", int(headers.get("content-length", "0"))


class CutHere(Exception):
    """A body reached the length a cut lets through."""


class Tamper:
    """A sink that passes a body of ``length`` bytes on to ``sink`` with one
    bit flipped, or cut short (its first bytes, then CutHere), as ``fault``
    (s3_fault_proxy.Fault: kind "flip" or "cut", ``offset`` or ``at``)
    says."""

    def __init__(self, sink, fault, length: int):
        self.sink = sink
        self.cut = fault.kind == "cut"
        if fault.offset is not None:
            self.offset, self.bit = fault.offset, 0
        else:
            self.offset, self.bit = divmod(min(int(fault.at * length * 8), length * 8 - 1), 8)
        self.passed = 0

    def __call__(self, piece: bytes) -> None:
        start = self.passed
        self.passed += len(piece)
        if self.cut and self.passed > self.offset:
            if self.offset > start:
                self.sink(piece[:self.offset - start])
            raise CutHere()
        if not self.cut and start <= self.offset < self.passed:
            flipped = bytearray(piece)
            flipped[self.offset - start] ^= 1 << self.bit
            piece = bytes(flipped)
        self.sink(piece)
