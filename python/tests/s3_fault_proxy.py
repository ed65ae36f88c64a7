"""An HTTP proxy between shardkeep and the S3 server that injects faults.

Requests pass through byte for byte (headers untouched, so signatures
still verify: the client signs the Host it sends, the proxy's, and the
server checks the Host it receives), except where a fault changes them.
What happens to a request comes from the rules armed below, first match
first, else from the random plan set with ``chaos`` (s3_chaos.py). A
fault (``Fault.kind``) is one of:

* ``error``: the proxy answers with an S3 error itself (503 SlowDown,
  500 InternalError, or any status and code);
* ``drop``: the connection closes after the request's head and part of
  its body were read; nothing reaches the server;
* ``cut``: a body is cut short. An upload's: part of it reaches the
  server, then both connections close. Otherwise the answer's: its head
  and part of its body reach the client, then the connection closes (an
  answer without a body is lost whole);
* ``lost``: the request reaches the server whole and takes effect; the
  connection closes before the answer does;
* ``flip``: one bit flips in an upload's body on its way to the server,
  or else in a 2xx answer's body on its way to the client;
* ``delay``: the server's answer is held back ``delay_s`` seconds, or
  until the client gives up and closes the connection;
* ``hold``: the request is parked until ``release``, to act on the
  server while a save is in flight.

A cut or a flip lands at the fraction ``at`` of the body's length, or at
byte ``offset`` (a flip there turns its lowest bit). When
the server cannot be reached, the proxy drops the client's connection, as
a dead server would. ``seen`` records each request and what was done to
it.

One thread per client connection and one upstream connection per client
connection, so the client's connection reuse and parallel requests are
kept as they are.
"""

from __future__ import annotations

import collections
import dataclasses
import select
import socket
import threading
import time
import urllib.parse

import pytest

from s3_http import Closed, CutHere, Stream, Tamper, body_framing, parse_head

_ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
               '<Message>{message}</Message><Resource>{resource}</Resource>'
               '<RequestId>fault-proxy</RequestId></Error>')
_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            500: "Internal Server Error", 503: "Service Unavailable"}
# What ``seen`` says of a request each fault acted on.
_OUTCOMES = {"drop": "dropped", "cut": "cut", "lost": "lost", "flip": "flipped",
             "delay": "delayed"}


@dataclasses.dataclass(frozen=True)
class Fault:
    """What to do to one request (the module's docstring lists the kinds)."""

    kind: str
    status: int = 503            # error
    code: str = "SlowDown"       # error
    at: float = 0.5              # cut, flip: where in the body, a fraction of its length
    offset: int | None = None    # cut, flip: where in the body, a byte (instead of ``at``)
    delay_s: float = 0.0         # delay


@dataclasses.dataclass
class _Rule:
    fault: Fault
    count: int                   # requests still to act on
    method: str | None
    query: str | None            # a query parameter the request must carry
    after: int = 0               # matching requests to let through first
    path: str | None = None      # text the request's path must end with

    def matches(self, method: str, params: dict, path: str) -> bool:
        return ((self.method is None or self.method == method) and
                (self.query is None or self.query in params) and
                (self.path is None or path.endswith(self.path)))


@dataclasses.dataclass
class Seen:
    """One request the proxy received, and what it did with it."""

    method: str
    target: str
    outcome: str  # "forwarded", "error 503", "dropped", "cut", "lost", "flipped",
                  # "delayed", "stalled" (the client gave up waiting), "unreachable"
    authorization: str | None = None  # the request's Authorization header


class FaultProxy:
    """Listens on 127.0.0.1; forwards to ``upstream`` ("http://host:port")."""

    def __init__(self, upstream: str):
        parsed = urllib.parse.urlparse(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._plan = None
        self._released = threading.Event()
        self._released.set()
        self._held = threading.Condition(self._lock)
        self._holding = 0
        self._stopping = threading.Event()
        self.seen: list[Seen] = []
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name="s3-fault-proxy")
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- arming ------------------------------------------------------------

    def inject(self, fault: Fault, count: int = 1, *, method: str | None = None,
               query: str | None = None, path: str | None = None, after: int = 0) -> None:
        """Does ``fault`` to ``count`` matching requests (``path``: those
        whose path ends so), after letting the first ``after`` of them
        through."""
        with self._lock:
            if fault.kind == "hold":
                self._released.clear()
            self._rules.append(_Rule(fault, count, method, query, after, path))

    def fail(self, count: int = 1, *, status: int = 503, code: str = "SlowDown",
             method: str | None = None, query: str | None = None, after: int = 0) -> None:
        """Answers ``count`` matching requests with an S3 error."""
        self.inject(Fault("error", status, code), count, method=method, query=query,
                    after=after)

    def drop(self, count: int = 1, *, method: str | None = None,
             query: str | None = None) -> None:
        """Closes the connection of the next ``count`` matching requests
        after reading their head (and part of their body)."""
        self.inject(Fault("drop"), count, method=method, query=query)

    def flip(self, count: int = 1, *, offset: int | None = None, at: float = 0.5,
             method: str | None = None, query: str | None = None, path: str | None = None,
             after: int = 0) -> None:
        """Flips a bit of the body of ``count`` matching uploads (or, for
        requests without one, of their 2xx answers), at byte ``offset`` or
        else at the fraction ``at`` of the body."""
        self.inject(Fault("flip", at=at, offset=offset), count, method=method, query=query,
                    path=path, after=after)

    def hold(self, count: int = 1, *, method: str | None = None,
             query: str | None = None) -> None:
        """Parks the next ``count`` matching requests until ``release``."""
        self.inject(Fault("hold"), count, method=method, query=query)

    def chaos(self, plan) -> None:
        """Requests no rule takes get ``plan.choose(method, target,
        headers)``'s fault (a s3_chaos.RandomFaults); None stops that."""
        with self._lock:
            self._plan = plan

    def wait_held(self, at_least: int = 1, timeout: float = 30.0) -> None:
        with self._held:
            if not self._held.wait_for(lambda: self._holding >= at_least, timeout):
                raise AssertionError(f"no request was held within {timeout} s; seen: "
                                     f"{[(s.method, s.target) for s in self.seen]}")

    def release(self) -> None:
        self._released.set()

    def disarm(self) -> None:
        """Clears the rules and the plan; releases held requests."""
        with self._lock:
            self._rules.clear()
            self._plan = None
        self._released.set()

    def injected(self) -> int:
        """How many requests the proxy did something to other than forwarding."""
        with self._lock:
            return sum(s.outcome != "forwarded" for s in self.seen)

    def tally(self) -> collections.Counter[str]:
        """How many requests had each outcome."""
        with self._lock:
            return collections.Counter(s.outcome for s in self.seen)

    def close(self) -> None:
        self._stopping.set()
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
        while not self._stopping.is_set():
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

    def _choose(self, method: str, target: str, headers: dict) -> Fault | None:
        parts = urllib.parse.urlsplit(target)
        params = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        with self._lock:
            for rule in self._rules:
                if rule.count > 0 and rule.matches(method, params, parts.path):
                    if rule.after > 0:
                        rule.after -= 1
                        return None
                    rule.count -= 1
                    return rule.fault
            plan = self._plan
        return plan.choose(method, target, headers) if plan is not None else None

    def _record(self, method: str, target: str, outcome: str,
                headers: dict | None = None) -> None:
        with self._lock:
            self.seen.append(Seen(method, target, outcome,
                                  (headers or {}).get("authorization")))

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream = None
        try:
            incoming = Stream(client)
            while True:
                head = incoming.head()
                (method, target, *_), headers = parse_head(head)
                fault = self._choose(method, target, headers)
                if fault is not None and fault.kind == "hold":
                    with self._held:
                        self._holding += 1
                        self._held.notify_all()
                    self._released.wait()
                    fault = None
                if fault is not None and fault.kind == "drop":
                    self._record(method, target, "dropped")
                    framing, length = body_framing(headers)
                    if framing == "length" and length and "expect" not in headers:
                        incoming.exactly(min(length, max(1, length // 2)), lambda _: None)
                    return
                if fault is not None and fault.kind == "error":
                    self._answer_error(client, incoming, headers, method, target, fault)
                    return
                if upstream is None:
                    try:
                        upstream = socket.create_connection(self.upstream, timeout=5)
                        upstream.settimeout(None)
                    except OSError:
                        self._record(method, target, "unreachable")
                        return
                    self._track(upstream)
                state, outcome = self._forward(client, incoming, upstream, head, headers,
                                               method, fault)
                self._record(method, target, outcome, headers)
                if state != "open":
                    return
        except (Closed, OSError, ValueError):
            return
        finally:
            self._untrack_and_close(upstream)
            self._untrack_and_close(client)

    def _answer_error(self, client, incoming, headers, method, target, fault) -> None:
        """Sends the fault's S3 error and closes the connection.

        The body is read first (unless the client waits for 100-continue,
        in which case it sends none), so the client sees the answer rather
        than a reset.
        """
        framing, length = body_framing(headers)
        if "100-continue" not in headers.get("expect", "").lower():
            if framing == "chunked":
                incoming.chunked(lambda _: None)
            else:
                incoming.exactly(length, lambda _: None)
        body = _ERROR_BODY.format(code=fault.code, message=f"injected {fault.code}",
                                  resource=urllib.parse.urlsplit(target).path).encode()
        reason = _REASONS.get(fault.status, "Error")
        response = (f"HTTP/1.1 {fault.status} {reason}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        if method != "HEAD":
            response += body
        self._record(method, target, f"error {fault.status}")
        client.sendall(response)

    def _hold_back(self, client: socket.socket, seconds: float) -> bool:
        """Waits ``seconds``; False as soon as the client closes its
        connection (it gave up waiting) or the proxy closes."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            readable, _, _ = select.select([client], [], [], min(left, 0.2))
            if readable and not client.recv(1, socket.MSG_PEEK):
                return False
            if readable:  # the client sent more (it never should): just wait
                self._stopping.wait(min(left, 0.2))
        return False

    def _forward(self, client, incoming, upstream, head, headers, method,
                 fault: Fault | None) -> tuple[str, str]:
        """Relays one request and its answer, doing ``fault`` (cut, lost,
        flip, delay or None) to them. Returns the connection's state,
        "open" when it may carry the next request, else "closed", and the
        outcome for ``seen``."""
        kind = fault.kind if fault is not None else None
        try:
            upstream.sendall(head)
        except OSError:
            return "closed", "unreachable"
        framing, length = body_framing(headers)
        # Faults on the request body; chunked bodies are relayed untouched.
        upload_fault = kind in ("cut", "flip") and framing == "length" and length > 0
        to_server = Tamper(upstream.sendall, fault, length) if upload_fault \
            else upstream.sendall
        failure: list[BaseException] = []

        def send_body():
            try:
                if framing == "chunked":
                    incoming.chunked(to_server)
                else:
                    incoming.exactly(length, to_server)
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
        outgoing = Stream(upstream)
        try:
            while True:
                response_head = outgoing.head()
                (_, status, *_), response_headers = parse_head(response_head)
                if not 100 <= int(status) < 200:
                    break
                client.sendall(response_head)
        except (Closed, OSError):  # a server answering a cut upload may reset
            if sender is not None:
                sender.join(5)
            return "closed", "cut" if upload_fault and kind == "cut" else "unreachable"
        if sender is not None:
            sender.join()
        if upload_fault and kind == "cut":  # the server may have answered early: withheld
            return "closed", "cut"
        status = int(status)
        has_body = method != "HEAD" and status not in (204, 304) and (
            "chunked" in response_headers.get("transfer-encoding", "").lower()
            or int(response_headers.get("content-length", "-1")) != 0)
        answer_length = int(response_headers.get("content-length", "0"))
        answer_fault = not upload_fault and answer_length > 0 and (
            kind == "cut" or (kind == "flip" and 200 <= status < 300))
        if kind == "lost" or (kind == "cut" and not upload_fault and not has_body):
            return "closed", _OUTCOMES[kind]
        if kind == "delay" and not self._hold_back(client, fault.delay_s):
            return "closed", "stalled"
        client.sendall(response_head)
        to_client = Tamper(client.sendall, fault, answer_length) if answer_fault \
            else client.sendall
        outcome = _OUTCOMES[kind] if upload_fault or answer_fault or kind == "delay" \
            else "forwarded"
        try:
            if not has_body:
                pass
            elif "chunked" in response_headers.get("transfer-encoding", "").lower():
                outgoing.chunked(client.sendall)
            elif "content-length" in response_headers:
                outgoing.exactly(answer_length, to_client)
            else:
                outgoing.until_close(client.sendall)
                return "closed", outcome
        except (CutHere, Closed, OSError):  # cut here, or either side went away
            return "closed", outcome
        if failure:
            return "closed", outcome
        if "close" in response_headers.get("connection", "").lower():
            return "closed", outcome
        return "open", outcome


@pytest.fixture
def s3_proxy(s3_server):
    """A FaultProxy in front of the session's server, closed at the end."""
    proxy = FaultProxy(s3_server.endpoint_url)
    yield proxy
    proxy.close()
