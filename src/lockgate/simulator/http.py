"""A lean HTTP/1.1 server for the simulator: httptools' parser on an asyncio protocol.

The simulator shares the machine with the clients it measures, so every microsecond it
spends per request is taken from them. aiohttp's server builds a request object, a
stream reader, a response object and a header multidict per request; here a request is
a few slots filled by the parser's callbacks, and a reply is written as one
pre-formatted byte string. What a client may rely on is kept: keep-alive (HTTP/1.1 by
default, HTTP/1.0 on request), pipelined requests answered in order, chunked request
bodies, ``Expect: 100-continue``, a size limit on bodies, a 400 for unparseable input
and a ``Date`` header.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

import httptools
import orjson

log = logging.getLogger("lockgate.simulator")

_JSON = "application/json"
_REASONS = {int(s): s.phrase for s in HTTPStatus}
_MAX_QUEUED = 32  # pipelined requests held per connection before reading pauses


@dataclass(slots=True)
class Reply:
    """What a handler answers: status, body and extra headers (protocol-neutral)."""

    status: int
    body: bytes
    headers: Mapping[str, str] | None = None
    content_type: str = _JSON


#: Returned by a handler to drop the connection without answering (a simulated hang).
DROP = Reply(0, b"")


class Headers(dict[str, str]):
    """Request headers; names are stored lower-cased and looked up case-insensitively."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class Request:
    """One parsed request: what the simulator's handlers read (the same attributes as
    ``aiohttp.web.BaseRequest`` offers, so one handler serves both servers)."""

    __slots__ = ("_body", "headers", "method", "path", "query_string")

    def __init__(self, method: str, path: str, query_string: str, headers: Headers,
                 body: bytes) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self._body = body

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.query_string))

    async def read(self) -> bytes:
        return self._body


Handler = Callable[[Request], Awaitable[Reply]]


class _Date:
    """The ``Date`` header value, formatted at most once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


def encode(reply: Reply, keep_alive: bool, date: bytes, head: bool = False) -> bytes:
    """The full HTTP/1.1 response for ``reply`` (without the body for a HEAD request)."""
    body = reply.body
    parts = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n"
             b"Server: lockgate-simulator\r\n" % (
                 reply.status, _REASONS.get(reply.status, "Unknown").encode(),
                 reply.content_type.encode(), len(body), date)]
    if reply.headers:
        parts.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in reply.headers.items())
    parts.append(b"\r\n" if keep_alive else b"Connection: close\r\n\r\n")
    if not head:
        parts.append(body)
    return b"".join(parts)


def _error(status: int, message: str) -> Reply:
    return Reply(status, orjson.dumps({"error": {
        "message": message, "type": "invalid_request_error", "param": None, "code": None}}))


class _Connection(asyncio.Protocol):
    """One client connection: parse, queue, answer in order."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers = Headers()
        self.body: list[bytes] = []
        self.size = 0
        self.queue: collections.deque[tuple[Request, bool]] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.paused = False

    # -- transport callbacks -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.queue.clear()
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(_error(400, "Protocol upgrades are not supported."))
        except httptools.HttpParserError as exc:
            # (An exception raised in a callback reaches here wrapped by the parser.)
            if isinstance(exc.__context__, _TooLarge) or self.size > self.server.max_body:
                self._fail(_error(413, f"Request body larger than {self.server.max_body} "
                                       "bytes."))
            else:
                self._fail(_error(400, f"Malformed HTTP request: {exc}"))

    def _fail(self, reply: Reply) -> None:
        if self.transport is not None:
            self.transport.write(encode(reply, False, self.server.date()))
            self.transport.close()

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = Headers()
        self.body = []
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            raise _TooLarge
        if (self.headers.get("expect", "").lower() == "100-continue"
                and self.transport is not None):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.server.max_body:
            raise _TooLarge
        self.body.append(body)

    def on_message_complete(self) -> None:
        url = httptools.parse_url(self.url)
        request = Request(self.parser.get_method().decode("ascii"), url.path.decode("latin-1"),
                          (url.query or b"").decode("latin-1"), self.headers,
                          b"".join(self.body) if len(self.body) != 1 else self.body[0])
        keep_alive = self.parser.should_keep_alive()
        if self.task is None:
            self.task = self.loop.create_task(self._serve(request, keep_alive))
        else:
            self.queue.append((request, keep_alive))
            if len(self.queue) >= _MAX_QUEUED and self.transport is not None:
                self.transport.pause_reading()
                self.paused = True

    # -- answering -------------------------------------------------------------------------

    async def _serve(self, request: Request, keep_alive: bool) -> None:
        server = self.server
        while True:
            try:
                reply = await server.handler(request)
            except Exception:  # (a cancellation, when the client goes away, passes through)
                log.exception("handler failed for %s %s", request.method, request.path)
                reply = _error(500, "The simulator failed on this request; see its log.")
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            if reply is DROP:
                transport.close()
                return
            transport.write(encode(reply, keep_alive, server.date(),
                                   head=request.method == "HEAD"))
            if not keep_alive:
                transport.close()
                return
            if not self.queue:
                self.task = None
                return
            request, keep_alive = self.queue.popleft()
            if self.paused and len(self.queue) < _MAX_QUEUED // 2:
                self.paused = False
                transport.resume_reading()


class _TooLarge(Exception):
    pass


@dataclass
class LeanServer:
    """A listening server; ``await close()`` stops it."""

    handler: Handler
    loop: asyncio.AbstractEventLoop
    max_body: int
    date: _Date = field(default_factory=_Date)
    connections: set[_Connection] = field(default_factory=set)
    server: asyncio.Server | None = None

    async def close(self, timeout: float) -> None:
        """Stop listening, let running handlers finish for up to ``timeout`` seconds, then
        close every connection."""
        if self.server is not None:
            self.server.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=timeout)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


async def serve_http(handler: Handler, host: str, port: int, *, max_body: int,
                     backlog: int = 1024) -> LeanServer:
    """Listen on ``host:port`` (0: a free port) and answer every request with
    ``handler``."""
    loop = asyncio.get_running_loop()
    lean = LeanServer(handler, loop, max_body)
    lean.server = await loop.create_server(lambda: _Connection(lean), host, port,
                                           backlog=backlog, reuse_address=True)
    return lean
