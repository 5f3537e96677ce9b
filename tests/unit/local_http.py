"""A real HTTP/1.1 server on a local socket for the apiserver client's tests.

Why this module exists: the lean client (driver/kube/http1.py) and KubeApi
on top of it are tested for framing edge cases that the real apiserver
does not produce on demand (a kept connection closed by the server, a
chunk split mid-event, a stream that breaks off). :class:`Server` reads
each request (head and ``Content-Length`` body) and writes what its
``answer`` returns; None closes the connection without answering.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

Answer = Callable[[bytes], bytes | None]  # request head -> raw response, or None: hang up


def length_answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunks(*parts: bytes, last: bool = True) -> bytes:
    """A chunked body of ``parts`` (one chunk each), ended unless ``last`` is False."""
    out = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts)
    return out + (b"0\r\n\r\n" if last else b"")


def chunked_answer(*parts: bytes, last: bool = True) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks(*parts, last=last)


@dataclass
class Server:
    """Answers each request with ``answer``; closes a connection after
    ``close_after`` requests on it (None: keeps it)."""

    answer: Answer
    close_after: int | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    port: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection ended

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while self.close_after is None or served < self.close_after:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                self.bodies.append(await reader.readexactly(content_length(head)))
                answer = self.answer(head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.closed.set()


Start = Callable[..., Awaitable[Server]]


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[Start]:
    """``start(answer, close_after=...)`` gives a listening :class:`Server`
    (awaited); all are closed at the end."""
    listening: list[asyncio.Server] = []

    async def start(answer: Answer, close_after: int | None = None) -> Server:
        srv = Server(answer, close_after)
        listener = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        listening.append(listener)
        srv.port = listener.sockets[0].getsockname()[1]
        return srv

    try:
        yield start
    finally:
        for listener in listening:
            listener.close()
            await listener.wait_closed()
