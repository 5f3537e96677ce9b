"""A lean HTTP/1.1 keep-alive client for the apiserver GETs on the prepare path.

Why this module exists: a prepare's claim GET is most of its latency, and
aiohttp's request path (URL objects, header multidicts, timers, response
objects, the connector's bookkeeping) cost 0.5-0.8 ms of CPU on the loop
per GET where this costs 0.3 (``make bench`` and a GET loop against the
local apiserver: the kubelet waits for that CPU on every prepare). It does
only what an apiserver GET needs: one request per connection at a time,
connections kept open and reused, a ``Content-Length`` or chunked body,
no compression asked for (the apiserver compresses only when asked), no
proxy (:class:`driver.kube.api.KubeApi` uses aiohttp where one is set).

A GET is idempotent, so a kept connection that the server closed while it
was idle (found dead when the request is written or before the first byte
of the answer) is retried once on a fresh connection; any other failure is
the caller's (:class:`ConnectionError` or :class:`TimeoutError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

# Kept connections at most; more concurrent GETs open (and then close) more.
MAX_IDLE = 8
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Http1Getter:
    """GETs ``path`` on ``host`` (``https://name:port``, or ``http://``)."""

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

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of ``GET path``; ``headers`` besides Host."""
        lines = [f"GET {self._prefix}{path} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        while self._idle:
            answer = await self._exchange(self._idle.pop(), request, kept=True)
            if answer is not None:
                return answer
            log.debug("a kept apiserver connection was closed; retrying on a new one")
        answer = await self._exchange(await self._connect(), request, kept=False)
        assert answer is not None  # a new connection raises instead
        return answer

    async def _connect(self) -> _Conn:
        return await asyncio.open_connection(
            self._hostname, self._port, ssl=self._ssl, server_hostname=self._server_hostname
        )

    async def _exchange(
        self, conn: _Conn, request: bytes, *, kept: bool
    ) -> tuple[int, bytes] | None:
        """The answer to ``request`` on ``conn``; None when a ``kept``
        connection gave no answer at all (closed by the server meanwhile)."""
        reader, writer = conn
        keep = False  # set only once the whole answer is read
        try:
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError) as exc:
                if kept:
                    return None  # (closed by the finally clause)
                raise ConnectionError(f"no answer from the apiserver: {exc!r}") from exc
            status, length, chunked, reusable = _parse_head(head)
            if status in (204, 304):
                body = b""
            elif chunked:
                body = await _read_chunked(reader)
            elif length is not None:
                body = await reader.readexactly(length)
            else:  # the body ends with the connection
                body, reusable = await reader.read(), False
            keep = reusable
        except asyncio.IncompleteReadError as exc:
            raise ConnectionError("the apiserver closed the connection mid-answer") from exc
        except (asyncio.LimitOverrunError, ValueError) as exc:
            raise ConnectionError(f"malformed answer from the apiserver: {exc}") from exc
        finally:
            if keep and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                writer.close()
        return status, body


def _parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, Content-Length, chunked, keep-alive) of a response head."""
    status_line, _, rest = head.partition(b"\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError(f"malformed status line: {status_line[:80]!r}")
    length: int | None = None
    chunked = False
    keep = parts[0] == b"HTTP/1.1"
    for line in rest.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            keep = value == b"keep-alive" or (keep and value != b"close")
    return int(parts[1]), length, chunked, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                pass
            return b"".join(parts)
        chunk = await reader.readexactly(size + 2)
        parts.append(chunk[:-2])
