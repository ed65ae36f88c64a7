"""An HTTP proxy between shardkeep and the S3 server that injects faults.

Requests pass through byte for byte (headers untouched, so signatures
still verify: the client signs the Host it sends, the proxy's, and the
server checks the Host it receives). Rules armed with ``fail`` answer the
next N matching requests themselves instead: with an S3 error (503
SlowDown, 500 InternalError, or any status and code), or by dropping the
connection after reading part of the request. ``hold`` parks matching
requests until ``release``, to act on the server while a save is in
flight. ``flip`` forwards matching requests with one bit of a body
flipped, as a transfer that TCP's checksum missed would damage it. When the server cannot be reached, the proxy drops the client's
connection, as a dead server would.

One thread per client connection and one upstream connection per client
connection, so the client's connection reuse and parallel requests are
kept as they are.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import urllib.parse

import pytest

_ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
               '<Message>{message}</Message><Resource>{resource}</Resource>'
               '<RequestId>fault-proxy</RequestId></Error>')
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            500: "Internal Server Error", 503: "Service Unavailable"}
_MAX_HEAD = 64 << 10


@dataclasses.dataclass
class _Rule:
    action: str                  # "error", "drop", "hold" or "flip"
    count: int                   # requests still to act on
    method: str | None
    query: str | None            # a query parameter the request must carry
    status: int = 503
    code: str = "SlowDown"
    after: int = 0               # matching requests to let through first
    offset: int = 0              # "flip": the byte of the body to damage
    path: str | None = None      # text the request's path must end with

    def matches(self, method: str, params: dict, target: str = "") -> bool:
        return ((self.method is None or self.method == method) and
                (self.query is None or self.query in params) and
                (self.path is None or urllib.parse.urlsplit(target).path.endswith(self.path)))


@dataclasses.dataclass
class Seen:
    """One request the proxy received, and what it did with it."""

    method: str
    target: str
    outcome: str                 # "forwarded", "flipped", "error 503", "dropped", "unreachable"


class _Closed(Exception):
    """The peer closed its connection."""


class _Stream:
    """Buffered reads from a socket: lines, exact lengths, chunked bodies."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise _Closed()
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


def _parse_head(head: bytes):
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return first, headers


def _flipping(sink, offset: int):
    """``sink`` with the lowest bit of byte ``offset`` of what passes flipped."""
    seen = 0

    def flip(piece: bytes) -> None:
        nonlocal seen
        if seen <= offset < seen + len(piece):
            i = offset - seen
            piece = piece[:i] + bytes([piece[i] ^ 1]) + piece[i + 1:]
        seen += len(piece)
        sink(piece)
    return flip


def _body_framing(headers: dict) -> tuple[str, int]:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked", 0
    return "length", int(headers.get("content-length", "0"))


class FaultProxy:
    """Listens on 127.0.0.1; forwards to ``upstream`` ("http://host:port")."""

    def __init__(self, upstream: str):
        parsed = urllib.parse.urlparse(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._released = threading.Event()
        self._released.set()
        self._held = threading.Condition(self._lock)
        self._holding = 0
        self.seen: list[Seen] = []
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name="s3-fault-proxy")
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- arming ------------------------------------------------------------

    def fail(self, count: int = 1, *, status: int = 503, code: str = "SlowDown",
             method: str | None = None, query: str | None = None, after: int = 0) -> None:
        """Answers ``count`` matching requests with an S3 error, after
        letting the first ``after`` of them through."""
        with self._lock:
            self._rules.append(_Rule("error", count, method, query, status, code, after))

    def drop(self, count: int = 1, *, method: str | None = None,
             query: str | None = None) -> None:
        """Closes the connection of the next ``count`` matching requests
        after reading their head (and part of their body)."""
        with self._lock:
            self._rules.append(_Rule("drop", count, method, query))

    def hold(self, count: int = 1, *, method: str | None = None,
             query: str | None = None) -> None:
        """Parks the next ``count`` matching requests until ``release``."""
        with self._lock:
            self._released.clear()
            self._rules.append(_Rule("hold", count, method, query))

    def flip(self, count: int = 1, *, offset: int = 0, method: str | None = None,
             query: str | None = None, path: str | None = None, after: int = 0) -> None:
        """Forwards ``count`` matching requests (after letting the first
        ``after`` through; ``path``: those whose path ends so) with the
        lowest bit of byte ``offset`` flipped in the body they carry, or,
        for a request without a body, in the body of the answer (bodies
        framed by Content-Length)."""
        with self._lock:
            self._rules.append(_Rule("flip", count, method, query, after=after, offset=offset,
                                     path=path))

    def wait_held(self, at_least: int = 1, timeout: float = 30.0) -> None:
        with self._held:
            if not self._held.wait_for(lambda: self._holding >= at_least, timeout):
                raise AssertionError(f"no request was held within {timeout} s; seen: "
                                     f"{[(s.method, s.target) for s in self.seen]}")

    def release(self) -> None:
        self._released.set()

    def disarm(self) -> None:
        with self._lock:
            self._rules.clear()
        self._released.set()

    def injected(self) -> int:
        """How many requests the proxy answered or dropped itself."""
        with self._lock:
            return sum(s.outcome != "forwarded" for s in self.seen)

    def close(self) -> None:
        self._closed = True
        self._released.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # -- serving -----------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _untrack_and_close(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.discard(sock)
        try:
            sock.close()
        except OSError:
            pass

    def _take_rule(self, method: str, params: dict, target: str) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.count > 0 and rule.matches(method, params, target):
                    if rule.after > 0:
                        rule.after -= 1
                        return None
                    rule.count -= 1
                    return rule
        return None

    def _record(self, method: str, target: str, outcome: str) -> None:
        with self._lock:
            self.seen.append(Seen(method, target, outcome))

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream = None
        try:
            incoming = _Stream(client)
            while True:
                head = incoming.head()
                (method, target, *_), headers = _parse_head(head)
                params = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query,
                                               keep_blank_values=True)
                rule = self._take_rule(method, params, target)
                if rule is not None and rule.action == "hold":
                    with self._held:
                        self._holding += 1
                        self._held.notify_all()
                    self._released.wait()
                    rule = None
                if rule is not None and rule.action == "drop":
                    self._record(method, target, "dropped")
                    framing, length = _body_framing(headers)
                    if framing == "length" and length and "expect" not in headers:
                        incoming.exactly(min(length, max(1, length // 2)), lambda _: None)
                    return
                if rule is not None and rule.action == "error":
                    self._answer_error(client, incoming, head, headers, method, target, rule)
                    return
                if upstream is None:
                    try:
                        upstream = socket.create_connection(self.upstream, timeout=5)
                        upstream.settimeout(None)
                    except OSError:
                        self._record(method, target, "unreachable")
                        return
                    self._track(upstream)
                outcome = self._forward(client, incoming, upstream, head, headers, method,
                                        rule.offset if rule is not None else None)
                self._record(method, target, "unreachable" if outcome == "lost" else
                             "flipped" if rule is not None else "forwarded")
                if outcome != "open":
                    return
        except (_Closed, OSError, ValueError):
            return
        finally:
            self._untrack_and_close(upstream)
            self._untrack_and_close(client)

    def _answer_error(self, client, incoming, head, headers, method, target, rule) -> None:
        """Sends the rule's S3 error and closes the connection.

        The body is read first (unless the client waits for 100-continue,
        in which case it sends none), so the client sees the answer rather
        than a reset.
        """
        framing, length = _body_framing(headers)
        if "100-continue" not in headers.get("expect", "").lower():
            if framing == "chunked":
                incoming.chunked(lambda _: None)
            else:
                incoming.exactly(length, lambda _: None)
        body = _ERROR_BODY.format(code=rule.code, message=f"injected {rule.code}",
                                  resource=urllib.parse.urlsplit(target).path).encode()
        reason = _REASONS.get(rule.status, "Error")
        response = (f"HTTP/1.1 {rule.status} {reason}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        if method != "HEAD":
            response += body
        client.sendall(response)
        self._record(method, target, f"error {rule.status}")

    def _forward(self, client, incoming, upstream, head, headers, method,
                 flip: int | None = None) -> str:
        """Relays one request and its response, with byte ``flip`` of the
        request's body (or, without one, of the answer's) damaged. Returns
        "open" when the connection may carry the next request, "closed"
        when the answer was relayed but the connection ends, "lost" when
        the server went away before answering."""
        try:
            upstream.sendall(head)
        except OSError:
            return "lost"
        framing, length = _body_framing(headers)
        failure: list[BaseException] = []
        up = upstream.sendall
        down = client.sendall
        if flip is not None and framing == "length" and length:
            up = _flipping(up, flip)
        elif flip is not None:
            down = _flipping(down, flip)

        def send_body():
            try:
                if framing == "chunked":
                    incoming.chunked(upstream.sendall)
                else:
                    incoming.exactly(length, up)
            except BaseException as e:  # noqa: BLE001 - reported to the relaying thread
                failure.append(e)
                try:
                    upstream.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        # The body goes up on its own thread: with "Expect: 100-continue"
        # the client sends it only after the server's interim answer, which
        # this thread relays meanwhile.
        sender = None
        if framing == "chunked" or length:
            sender = threading.Thread(target=send_body, daemon=True)
            sender.start()
        outgoing = _Stream(upstream)
        try:
            while True:
                response_head = outgoing.head()
                client.sendall(response_head)
                (_, status, *_), response_headers = _parse_head(response_head)
                if 100 <= int(status) < 200:
                    continue
                if method == "HEAD" or int(status) in (204, 304):
                    break
                if "chunked" in response_headers.get("transfer-encoding", "").lower():
                    outgoing.chunked(client.sendall)
                elif "content-length" in response_headers:
                    outgoing.exactly(int(response_headers["content-length"]), down)
                else:
                    outgoing.until_close(client.sendall)
                    return "closed"
                break
        except _Closed:
            if sender is not None:
                sender.join(5)
            return "lost"
        if sender is not None:
            sender.join()
            if failure:
                return "closed"
        if "close" in response_headers.get("connection", "").lower():
            return "closed"
        return "open"


@pytest.fixture
def s3_proxy(s3_server):
    """A FaultProxy in front of the session's server, closed at the end."""
    proxy = FaultProxy(s3_server.endpoint_url)
    yield proxy
    proxy.close()
