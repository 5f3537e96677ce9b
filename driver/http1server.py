"""A small HTTP/1.1 server for read-only GET endpoints on the process's loop.

Why this module exists: the plugin's ``/metrics`` and ``/healthz`` answer
Prometheus scrapes and kubelet probes, nothing else, and aiohttp's server
(with aiohttp, multidict, yarl and their friends) was about 1.5-1.7 MB of the
plugin's resident memory for that (docs/figures.md, issue 36). This serves
GET and HEAD on fixed paths: request line and headers read under a size
limit and a time limit, keep-alive as HTTP/1.1 says (``Connection: close``
and HTTP/1.0 end it), a request with a body refused, and a bounded number
of connections. Anything it does not understand gets a 4xx answer naming
what, and the connection is closed; it never reaches a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8192  # request line and headers together
MAX_CONNECTIONS = 32  # open at once; one more is closed at once
HEAD_TIMEOUT_S = 10.0  # to read one request's line and headers
IDLE_TIMEOUT_S = 60.0  # a kept connection with no new request


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[], Reply | Awaitable[Reply]]


class BadRequest(Exception):
    """A request this server refuses; ``status`` and the reason are the answer."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    keep_alive: bool


def parse_head(head: bytes) -> Request:
    """The request line and headers (without the blank line), or BadRequest."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes any byte
        raise BadRequest(HTTPStatus.BAD_REQUEST, "undecodable request") from exc
    line, *fields = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"bad request line {line[:80]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for field in fields:
        name, sep, value = field.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"bad header line {field[:80]!r}")
        headers[name.lower()] = value.strip()
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "a request body is not accepted here")
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return Request(method, target.split("?", 1)[0], keep)


def encode(reply: Reply, keep_alive: bool, head_only: bool, extra: str = "") -> bytes:
    status = HTTPStatus(reply.status)
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        f"Content-Type: {reply.content_type}\r\n"
        f"Content-Length: {len(reply.body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else reply.body)


class GetServer:
    """Serves ``routes`` (path -> handler) for GET and HEAD."""

    def __init__(self, routes: Mapping[str, Handler]) -> None:
        self._routes = dict(routes)
        self._open = 0

    async def start(self, host: str, port: int) -> asyncio.Server:
        """Listen on ``host:port`` (0: any free port; the server's sockets say which)."""
        return await asyncio.start_server(
            self._connection, host, port, limit=MAX_HEAD_BYTES, reuse_address=True
        )

    async def serve(self, host: str, port: int, what: str) -> None:
        """Listen on ``host:port`` until cancelled."""
        server = await self.start(host, port)
        log.info("serving %s on %s:%d", what, host, port)
        try:
            await asyncio.Event().wait()
        finally:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open <= MAX_CONNECTIONS:
                await self._requests(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the peer went away or stalled: nothing to answer
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_S if first else IDLE_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.LimitOverrunError, ValueError):
                head = b""  # no end of the head within MAX_HEAD_BYTES
            except asyncio.IncompleteReadError:
                return  # closed between requests
            first = False
            try:
                if not head:
                    raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large")
                request = parse_head(head[:-4])
            except BadRequest as bad:
                reply = Reply(bad.status, f"{bad}\n".encode())
                writer.write(encode(reply, keep_alive=False, head_only=False))
                await writer.drain()
                return
            reply, extra = await self._answer(request)
            writer.write(encode(reply, request.keep_alive, request.method == "HEAD", extra))
            await writer.drain()
            if not request.keep_alive:
                return

    async def _answer(self, request: Request) -> tuple[Reply, str]:
        if request.method not in ("GET", "HEAD"):
            return Reply(405, f"{request.method} is not served\n".encode()), "Allow: GET, HEAD\r\n"
        handler = self._routes.get(request.path)
        if handler is None:
            return Reply(404, f"no {request.path}; try {', '.join(self._routes)}\n".encode()), ""
        try:
            result = handler()
            return (result if isinstance(result, Reply) else await result), ""
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return Reply(500, b"internal error; see the process's log\n"), ""
