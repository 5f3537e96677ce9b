"""A lean HTTP/1.1 keep-alive client: every apiserver request we send.

Why this module exists: a prepare's claim GET is most of its latency, and
aiohttp's request path (URL objects, header multidicts, timers, response
objects, the connector's bookkeeping) cost 0.5-0.8 ms of CPU on the loop
per GET where this costs 0.3 (``make bench`` and a GET loop against the
local apiserver: the kubelet waits for that CPU on every prepare); and
aiohttp with its dependencies is megabytes of every plugin's memory
(issue 36). It does only what the apiserver needs: one request per
connection at a time, connections kept open and reused, a JSON body sent
with ``Content-Length``, a ``Content-Length``, chunked or until-close
answer (:mod:`driver.kube.http1_body`), no compression asked for (the
apiserver compresses only when asked), no proxy
(:class:`driver.kube.api.KubeApi` uses aiohttp where one is set).

Kept connections: one the server closed while it sat idle is usually seen
closed already (end of stream) and dropped before anything is written,
whatever the method. One found dead only when the request is written or
before the first byte of the answer is retried once on a fresh connection
for GET alone: as in Go's net/http, only a request that is safe to repeat
is repeated, since the server may have acted on it. Any other failure is
the caller's (:class:`ConnectionError` or :class:`TimeoutError`). A
streamed answer (a watch) keeps its connection until it is closed; the
connection is never returned to the idle pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from urllib.parse import urlsplit

from driver.kube.http1_body import Head, StreamResponse, parse_head, read_body

log = logging.getLogger(__name__)

# Kept connections at most; more concurrent requests open (and then close) more.
MAX_IDLE = 8
# Requests in flight at most (watches not counted: each holds a connection of
# its own for minutes); more wait for a slot, and then mostly for a kept
# connection, rather than each opening a TLS connection of its own (a burst
# of slice writes or claim reads). The wait counts against the request's time.
MAX_OPEN = 16
DRAIN_OVER = 2**16  # a request larger than this waits for the socket to take it
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Http1Client:
    """Requests to ``host`` (``https://name:port[/prefix]``, or ``http://``)."""

    def __init__(
        self, host: str, ssl_context: ssl.SSLContext | None, server_hostname: str | None = None
    ) -> None:
        url = urlsplit(host)
        self._tls = url.scheme == "https"
        if url.hostname is None:
            raise ValueError(f"no host name in {host!r}")
        self._hostname = url.hostname
        self._port = url.port or (443 if self._tls else 80)
        self._host_header = url.netloc
        self._prefix = url.path.rstrip("/")
        self._ssl = (ssl_context or ssl.create_default_context()) if self._tls else None
        self._server_hostname = (server_hostname or self._hostname) if self._tls else None
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(MAX_OPEN)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of ``method path``; ``headers`` besides Host and
        Content-Length."""
        async with self._slots:
            return await self._request(method, path, headers, body)

    async def _request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        (reader, writer), head = await self._send(method, self._encode(method, path, headers, body))
        keep = False  # set only once the whole answer is read
        try:
            answer, keep = await read_body(reader, head)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("the apiserver closed the connection mid-answer") from exc
        except asyncio.LimitOverrunError as exc:
            raise ConnectionError(f"malformed answer from the apiserver: {exc}") from exc
        finally:
            if keep and len(self._idle) < MAX_IDLE:
                self._idle.append((reader, writer))
            else:
                writer.close()
        return head.status, answer

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        return await self.request("GET", path, headers)

    async def stream(self, method: str, path: str, headers: dict[str, str]) -> StreamResponse:
        """The answer to ``method path`` with its body still to read, on a
        connection of its own from then on (the caller closes it)."""
        (reader, writer), head = await self._send(method, self._encode(method, path, headers))
        return StreamResponse(head, reader, writer)

    def _encode(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None
    ) -> bytes:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")

    async def _send(self, method: str, request: bytes) -> tuple[_Conn, Head]:
        """A connection with ``request`` written and its answer's head read."""
        while self._idle:
            conn = self._idle.pop()
            if conn[0].at_eof():  # closed by the server while idle: nothing was sent
                conn[1].close()
                continue
            head = await self._start(conn, request, retry=method == "GET")
            if head is not None:
                return conn, head
            log.debug("a kept apiserver connection was closed; retrying on a new one")
        conn = await self._connect()
        head = await self._start(conn, request, retry=False)
        assert head is not None  # without a retry, a failure raises
        return conn, head

    async def _connect(self) -> _Conn:
        return await asyncio.open_connection(
            self._hostname, self._port, ssl=self._ssl, server_hostname=self._server_hostname
        )

    async def _start(self, conn: _Conn, request: bytes, *, retry: bool) -> Head | None:
        """The head of the answer to ``request`` on ``conn``; None when a
        kept connection gave no answer at all and ``retry`` allows another
        try. The connection is closed on any failure."""
        reader, writer = conn
        try:
            writer.write(request)
            if len(request) > DRAIN_OVER:
                await writer.drain()
            raw = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError) as exc:
            writer.close()
            if retry:
                return None
            raise ConnectionError(f"no answer from the apiserver: {exc!r}") from exc
        except asyncio.LimitOverrunError as exc:
            writer.close()
            raise ConnectionError(f"malformed answer from the apiserver: {exc}") from exc
        except BaseException:  # cancelled, or out of time: the answer may still come
            writer.close()
            raise
        try:
            return parse_head(raw)
        except ConnectionError:
            writer.close()
            raise
