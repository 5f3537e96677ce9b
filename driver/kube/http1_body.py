"""Reading an HTTP/1.1 answer: its head, its body, and a body as a stream.

Why this module exists: :mod:`driver.kube.http1` keeps connections and
sends requests; this is the other half, the framing of what comes back
(``Content-Length``, chunked, or until the connection closes) and
:class:`StreamResponse`, a watch's endless chunked body read piece by piece
and split into lines. Every framing fault is a :class:`ConnectionError`
(the server closed mid-answer, or sent what HTTP does not allow).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

READ_SIZE = 2**16  # a body of unknown or large length is read this much at a time


@dataclass(frozen=True)
class Head:
    status: int
    length: int | None  # Content-Length, if given
    chunked: bool
    keep_alive: bool  # the connection may serve another request once the body is read

    @property
    def empty(self) -> bool:
        return self.status in (204, 304) or 100 <= self.status < 200


def parse_head(head: bytes) -> Head:
    """The :class:`Head` of a response head (status line to blank line)."""
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
            if not value.isdigit():
                raise ConnectionError(f"malformed Content-Length: {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            keep = value == b"keep-alive" or (keep and value != b"close")
    return Head(int(parts[1]), length, chunked, keep)


async def read_chunk(reader: asyncio.StreamReader) -> bytes | None:
    """The next chunk of a chunked body; None after the last (trailers read)."""
    size_line = await reader.readuntil(b"\r\n")
    try:
        size = int(size_line.split(b";", 1)[0].strip(), 16)
    except ValueError as exc:
        raise ConnectionError(f"malformed chunk size: {size_line[:40]!r}") from exc
    if size == 0:
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
            pass
        return None
    chunk = await reader.readexactly(size + 2)
    if chunk[-2:] != b"\r\n":
        raise ConnectionError("a chunk does not end with CRLF")
    return chunk[:-2]


async def read_body(reader: asyncio.StreamReader, head: Head) -> tuple[bytes, bool]:
    """(the whole body, whether the connection may be kept after it)."""
    if head.empty:
        return b"", head.keep_alive
    if head.chunked:
        parts: list[bytes] = []
        while (chunk := await read_chunk(reader)) is not None:
            parts.append(chunk)
        return b"".join(parts), head.keep_alive
    if head.length is not None:
        return await reader.readexactly(head.length), head.keep_alive
    return await reader.read(), False  # the body ends with the connection


async def body_pieces(reader: asyncio.StreamReader, head: Head) -> AsyncIterator[bytes]:
    """The body as it arrives (a watch's events come chunk by chunk)."""
    if head.empty:
        return
    if head.chunked:
        while (chunk := await read_chunk(reader)) is not None:
            yield chunk
    elif head.length is not None:
        left = head.length
        while left:
            piece = await reader.readexactly(min(left, READ_SIZE))
            left -= len(piece)
            yield piece
    else:
        while piece := await reader.read(READ_SIZE):
            yield piece


class StreamResponse:
    """An answer whose body is read as it comes; its connection is never
    reused and is closed by :meth:`close` (or at the body's end)."""

    def __init__(
        self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.status = head.status
        self._pieces = body_pieces(reader, head)
        self._writer = writer

    async def read(self) -> bytes:
        """The whole body (an error's answer); then the connection is closed."""
        try:
            return b"".join([piece async for piece in self._pieces])
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ConnectionError(f"the apiserver's answer broke off: {exc!r}") from exc
        finally:
            self.close()

    async def lines(self, deadline: float | None = None) -> AsyncIterator[bytes]:
        """The body's lines (without their newline), until it ends; each
        read must finish by ``deadline`` (the loop's clock) or the stream
        ends with :class:`TimeoutError`. A last line without a newline counts."""
        parts: list[bytes] = []  # of the line not yet complete (a large event spans chunks)
        try:
            while True:
                async with asyncio.timeout_at(deadline):
                    piece = await anext(self._pieces, None)
                if piece is None:
                    break
                parts.append(piece)
                if b"\n" in piece:
                    *complete, rest = b"".join(parts).split(b"\n")
                    parts = [rest] if rest else []
                    for line in complete:
                        yield line
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ConnectionError(f"the apiserver's stream broke off: {exc!r}") from exc
        finally:
            self.close()
        if parts:
            yield b"".join(parts)

    def close(self) -> None:
        self._writer.close()
