"""One HTTP/1.1 request, read strictly, for the controller's small authenticated endpoints (the
node agents' notice inbox): the standard library's threaded socket server, with the request
parsed here so that every limit is ours and every malformed request is answered.

* One request per connection (agents post one notice and go), answered with ``Connection:
  close`` and a JSON body; an error is ``{"error": "<one line>"}``.
* The whole request, from accept to its last body byte, must arrive within ``request_s``;
  the request line, the header block and the body each have a size limit; the number of
  connections being served at once has a limit, overall and per peer address. A slow or
  stalled client is cut off at its deadline (408) and can never hold more than its share.
* Refused, with the status RFC 9110/9112 give: a request line that is not ``METHOD /path
  HTTP/1.x`` (400, 414 when too long, 505 for another version), a header block too large or
  with too many fields (431), a header line that is folded, has no colon, a name that is not a
  token or a control character in its value (400), a repeated ``Content-Length``,
  ``Transfer-Encoding``, ``Authorization``, ``Content-Type``, ``Host`` or ``Expect`` (400), an
  HTTP/1.1 request without ``Host`` (400), any ``Transfer-Encoding`` (411; with a
  ``Content-Length`` too, 400: the classic smuggling pair), a missing ``Content-Length`` (411),
  one that is not plain ASCII digits (400), one over the body limit (413), an ``Expect`` other
  than ``100-continue`` (417), a body shorter than announced (400).

``respond`` runs the same code over bytes in memory: what the fuzz tests feed in bulk.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from autoscaler.model.errors import describe

log = logging.getLogger(__name__)

CHUNK = 16 * 1024
# After an error answer, what the client may still be sending is read and dropped for a moment
# before closing, so its kernel does not reset the connection over our answer.
LINGER_BYTES = 256 * 1024
LINGER_S = 1.0
SEND_S = 5.0
SINGLE = ("content-length", "transfer-encoding", "authorization", "content-type", "host", "expect")
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TARGET = re.compile(rb"^/[\x21-\x7e]*$")
_VERSION = re.compile(rb"^HTTP/([0-9])\.([0-9])$")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEAD_END = re.compile(rb"\r?\n\r?\n")

Answer = tuple[int, Mapping[str, Any]]


@dataclass(frozen=True)
class HttpLimits:
    request_line_bytes: int = 1024
    header_bytes: int = 8 * 1024
    header_count: int = 32
    body_bytes: int = 64 * 1024
    request_s: float = 10.0
    max_connections: int = 256
    max_per_peer: int = 32


class HttpError(Exception):
    """A request answered with ``status`` and the one-line ``reason``."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = dict(headers or {})


class _SilentError(Exception):
    """The peer sent nothing, or went away: there is nobody to answer."""


@dataclass(frozen=True)
class Head:
    method: str
    path: str
    version: tuple[int, int]
    headers: Mapping[str, str]

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


Recv = Callable[[int, float], bytes]
Send = Callable[[bytes], None]


class RequestReader:
    """Reads one request through ``recv(max_bytes, timeout_s)`` (b"" at the end of the stream,
    ``TimeoutError`` when nothing came in time) within ``limits.request_s`` overall."""

    def __init__(
        self,
        recv: Recv,
        send: Send,
        limits: HttpLimits,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recv = recv
        self._send = send
        self.limits = limits
        self._monotonic = monotonic
        self._deadline = monotonic() + limits.request_s
        self._buffer = bytearray()
        self._head: Head | None = None

    def _more(self) -> bool:
        remaining = self._deadline - self._monotonic()
        if remaining <= 0:
            raise HttpError(408, f"the request did not arrive within {self.limits.request_s:g} s")
        try:
            data = self._recv(CHUNK, remaining)
        except TimeoutError:
            raise HttpError(
                408, f"the request did not arrive within {self.limits.request_s:g} s"
            ) from None
        except OSError as exc:
            raise _SilentError(describe(exc)) from None
        self._buffer += data
        return bool(data)

    def head(self) -> Head:
        limits = self.limits
        most = limits.request_line_bytes + limits.header_bytes + 4
        while True:
            while self._buffer[:2] == b"\r\n" or self._buffer[:1] == b"\n":
                del self._buffer[: 2 if self._buffer[:1] == b"\r" else 1]
            end = _HEAD_END.search(self._buffer, 0, most)
            if end is not None:
                break
            first = self._buffer.find(b"\n")
            if (first < 0 and len(self._buffer) > limits.request_line_bytes) or (
                first > limits.request_line_bytes
            ):
                raise HttpError(414, f"the request line is over {limits.request_line_bytes} bytes")
            if len(self._buffer) >= most:
                raise HttpError(431, f"the header block is over {limits.header_bytes} bytes")
            if not self._more():
                if not self._buffer:
                    raise _SilentError("closed before a request")
                raise HttpError(400, "the request ended before its header block did")
        block = bytes(self._buffer[: end.start()])
        del self._buffer[: end.end()]
        lines = block.split(b"\n")
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
        if len(lines[0]) > limits.request_line_bytes:
            raise HttpError(414, f"the request line is over {limits.request_line_bytes} bytes")
        if len(block) - len(lines[0]) > limits.header_bytes:
            raise HttpError(431, f"the header block is over {limits.header_bytes} bytes")
        if len(lines) - 1 > limits.header_count:
            raise HttpError(431, f"more than {limits.header_count} header fields")
        method, path, version = _request_line(lines[0])
        self._head = Head(method, path, version, _headers(lines[1:], version))
        return self._head

    def body_length(self) -> int:
        """The announced body size, once it is one the endpoint takes."""
        head = self._require_head()
        length = head.header("content-length")
        if head.header("transfer-encoding") is not None:
            if length is not None:
                raise HttpError(400, "both Transfer-Encoding and Content-Length")
            raise HttpError(411, "send the body with a Content-Length, not a Transfer-Encoding")
        if length is None:
            raise HttpError(411, "a Content-Length is required")
        if not (length.isascii() and length.isdigit()):
            raise HttpError(400, "Content-Length is not a decimal number of bytes")
        if len(length) > 12 or int(length) > self.limits.body_bytes:
            raise HttpError(413, f"the body is over {self.limits.body_bytes} bytes")
        return int(length)

    def body(self) -> bytes:
        head = self._require_head()
        length = self.body_length()
        expect = head.header("expect")
        if expect is not None and head.version >= (1, 1):
            if expect.lower() != "100-continue":
                raise HttpError(417, "only Expect: 100-continue is understood")
            if len(self._buffer) < length:
                try:
                    self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError as exc:
                    raise _SilentError(describe(exc)) from None
        while len(self._buffer) < length:
            if not self._more():
                raise HttpError(400, f"the body ended before its {length} bytes")
        return bytes(self._buffer[:length])

    def _require_head(self) -> Head:
        if self._head is None:
            raise RuntimeError("read the head first")
        return self._head


def _request_line(line: bytes) -> tuple[str, str, tuple[int, int]]:
    parts = line.split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]):
        raise HttpError(400, "the request line is not METHOD /path HTTP/1.1")
    if not _TARGET.match(parts[1]):
        raise HttpError(400, "the request target is not an absolute path")
    version = _VERSION.match(parts[2])
    if version is None:
        raise HttpError(400, "the request line is not METHOD /path HTTP/1.1")
    number = (int(version[1]), int(version[2]))
    if number not in ((1, 0), (1, 1)):
        raise HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    path = parts[1].split(b"?", 1)[0].decode("ascii")
    return parts[0].decode("ascii"), path, number


def _headers(lines: list[bytes], version: tuple[int, int]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise HttpError(400, "folded header lines are not accepted")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise HttpError(400, "a header line is not name: value")
        value = value.strip(b" \t")
        if _CONTROL.search(value) or b"\r" in line:
            raise HttpError(400, "a header value holds a control character")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        if key in headers:
            if key in SINGLE:
                raise HttpError(400, f"the {name.decode('ascii')} header is repeated")
            text = headers[key] + ", " + text
        headers[key] = text
    if version >= (1, 1) and "host" not in headers:
        raise HttpError(400, "an HTTP/1.1 request needs a Host header")
    return headers


Handler = Callable[[Head, RequestReader], Answer]


def encode(
    status: int, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> bytes:
    body = json.dumps(payload).encode()
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def answer(reader: RequestReader, handler: Handler) -> tuple[int, bytes] | None:
    """Read one request and work out its answer: (status, the bytes to send), or None when the
    peer sent nothing to answer. An error in ``handler`` is a 500 and one log line."""
    try:
        head = reader.head()
        status, payload = handler(head, reader)
        return status, encode(status, payload)
    except HttpError as exc:
        return exc.status, encode(exc.status, {"error": exc.reason}, exc.headers)
    except _SilentError:
        return None
    except Exception as exc:  # a bug must cost one request, not the server's thread
        log.error("http endpoint: unexpected %s", describe(exc))
        return 500, encode(500, {"error": "internal error"})


def respond(raw: bytes, handler: Handler, limits: HttpLimits | None = None) -> bytes:
    """What the server sends back for ``raw`` (the client then closes its side): the same code
    as a socket, over memory."""
    stream = io.BytesIO(raw)
    sent = bytearray()

    def recv(most: int, timeout_s: float) -> bytes:
        return stream.read(min(most, 4096))

    reader = RequestReader(recv, sent.extend, limits or HttpLimits())
    result = answer(reader, handler)
    if result is not None:
        sent += result[1]
    return bytes(sent)


class _Slots:
    """How many connections are being served, overall and per peer address."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self._lock = threading.Lock()
        self._by_peer: dict[str, int] = {}
        self._count = 0
        self.refused = 0

    def take(self, peer: str) -> bool:
        with self._lock:
            held = self._by_peer.get(peer, 0)
            if self._count >= self.total or held >= self.per_peer:
                self.refused += 1
                return False
            self._count += 1
            self._by_peer[peer] = held + 1
            return True

    def give(self, peer: str) -> None:
        with self._lock:
            self._count -= 1
            held = self._by_peer.pop(peer, 1) - 1
            if held > 0:
                self._by_peer[peer] = held


class _Connection(socketserver.BaseRequestHandler):
    server: StrictHttpServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        limits = self.server.limits
        deadline = time.monotonic() + limits.request_s

        def remaining() -> float:
            return max(0.001, deadline - time.monotonic())

        def recv(most: int, timeout_s: float) -> bytes:
            sock.settimeout(max(0.001, timeout_s))
            return sock.recv(most)

        def send(data: bytes) -> None:
            sock.settimeout(max(remaining(), SEND_S))
            sock.sendall(data)

        if isinstance(sock, ssl.SSLSocket):
            try:
                sock.settimeout(remaining())
                sock.do_handshake()
            except (OSError, ValueError):
                self.server.outcome(0)
                return
        result = answer(RequestReader(recv, send, limits), self.server.handler)
        if result is None:
            return
        status, data = result
        self.server.outcome(status)
        try:
            send(data)
            _linger(sock)
        except (OSError, ValueError):
            return


def _linger(sock: socket.socket) -> None:
    """Half-close, then drop what the client still sends for a moment, so that its kernel does
    not answer our close with a reset that would lose the answer before it is read."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    sock.settimeout(LINGER_S)
    deadline = time.monotonic() + LINGER_S
    dropped = 0
    while dropped < LINGER_BYTES and time.monotonic() < deadline:
        try:
            data = sock.recv(CHUNK)
        except (OSError, ValueError):
            return
        if not data:
            return
        dropped += len(data)


class StrictHttpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """Serves ``handler`` under ``limits``; TLS when given a server context (the handshake runs
    in the connection's thread, under the request's deadline). ``outcome`` is called with each
    answer's status (0 for a failed TLS handshake)."""

    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    # A zone-wide reclaim is hundreds of agents posting at once.
    request_queue_size = 1024

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        limits: HttpLimits | None = None,
        tls: ssl.SSLContext | None = None,
        outcome: Callable[[int], None] | None = None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.handler = handler
        self.limits = limits or HttpLimits()
        self.outcome = outcome or (lambda status: None)
        self.slots = _Slots(self.limits.max_connections, self.limits.max_per_peer)
        super().__init__((host, port), _Connection)
        if tls is not None:
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Past its limits, a connection is closed at once, unanswered (answering over TLS
        would mean a handshake on the accepting thread)."""
        return self.slots.take(str(client_address[0]))

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.give(str(client_address[0]))
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.give(str(client_address[0]))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Never a traceback on stderr: one log line."""
        log.error("http endpoint: connection failed: %s", describe(sys.exc_info()[1]))
