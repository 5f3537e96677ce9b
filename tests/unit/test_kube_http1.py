"""The lean GET client (driver/kube/http1.py) against a real HTTP/1.1 server
on a local socket: bodies by length and chunked, kept connections reused,
a kept connection the server closed retried once, ``Connection: close``
honoured, and KubeApi.get's errors (status, unreachable) on top of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from driver.errors import ApiError, ApiStatusError
from driver.kube.api import KubeApi
from driver.kube.http1 import Http1Getter

Answer = Callable[[bytes], bytes]  # request head -> raw response


def length_answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunked_answer(body: bytes) -> bytes:
    chunks = b"".join(
        f"{len(body[i : i + 7]):x}\r\n".encode() + body[i : i + 7] + b"\r\n"
        for i in range(0, len(body), 7)
    )
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


@dataclass
class Server:
    """Answers each request with ``answer``; closes a connection after
    ``close_after`` requests on it (None: keeps it)."""

    answer: Answer
    close_after: int | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # a connection it closed

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while self.close_after is None or served < self.close_after:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                writer.write(self.answer(head))
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


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    """``await serve(answer, close_after=...)``: a listening :class:`Server`."""
    listening: list[asyncio.Server] = []

    async def start(answer: Answer, close_after: int | None = None) -> Server:
        srv = Server(answer, close_after)
        listener = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        listening.append(listener)
        srv.port = listener.sockets[0].getsockname()[1]
        return srv

    yield start
    for listener in listening:
        listener.close()
        await listener.wait_closed()


async def test_a_kept_connection_serves_the_next_get(serve: Start) -> None:
    srv = await serve(lambda _: length_answer(b'{"a": 1}'))
    getter = Http1Getter(f"http://127.0.0.1:{srv.port}", None)
    assert await getter.get("/x", {"Accept": "application/json"}) == (200, b'{"a": 1}')
    assert await getter.get("/y", {}) == (200, b'{"a": 1}')
    assert srv.connections == 1
    assert srv.requests[0].startswith(b"GET /x HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{srv.port}\r\n".encode() in srv.requests[0]
    assert b"Accept: application/json\r\n" in srv.requests[0]
    await getter.close()


async def test_a_chunked_body_is_joined(serve: Start) -> None:
    body = json.dumps({"items": list(range(40))}).encode()
    srv = await serve(lambda _: chunked_answer(body))
    getter = Http1Getter(f"http://127.0.0.1:{srv.port}", None)
    for _ in range(2):  # the connection is positioned after the last chunk
        assert await getter.get("/list", {}) == (200, body)
    assert srv.connections == 1
    await getter.close()


async def test_a_connection_the_server_closed_is_retried_on_a_new_one(
    serve: Start,
) -> None:
    srv = await serve(lambda _: length_answer(b"{}"), close_after=1)
    getter = Http1Getter(f"http://127.0.0.1:{srv.port}", None)
    assert await getter.get("/a", {}) == (200, b"{}")
    async with asyncio.timeout(5):
        await srv.closed.wait()  # the server has closed the kept connection
    assert await getter.get("/b", {}) == (200, b"{}")
    assert srv.connections == 2
    await getter.close()


async def test_connection_close_is_not_kept(serve: Start) -> None:
    srv = await serve(lambda _: length_answer(b"{}", extra="Connection: close\r\n"))
    getter = Http1Getter(f"http://127.0.0.1:{srv.port}", None)
    await getter.get("/a", {})
    await getter.get("/b", {})
    assert srv.connections == 2
    await getter.close()


def kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def test_kube_api_get_decodes_and_sends_the_token(serve: Start, tmp_path: Path) -> None:
    srv = await serve(lambda _: length_answer(b'{"kind": "ResourceClaim"}'))
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.port)))
    try:
        got = await api.get("/apis/resource.k8s.io/v1/x", {"limit": 5, "continue": None})
        assert got == {"kind": "ResourceClaim"}
        assert srv.requests[0].startswith(b"GET /apis/resource.k8s.io/v1/x?limit=5 HTTP/1.1")
        assert b"Authorization: Bearer secret-token\r\n" in srv.requests[0]
    finally:
        await api.close()


async def test_kube_api_get_raises_the_status(serve: Start, tmp_path: Path) -> None:
    srv = await serve(lambda _: length_answer(b'{"reason": "NotFound"}', status="404 Not Found"))
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.port)))
    try:
        with pytest.raises(ApiStatusError) as info:
            await api.get("/api/v1/nodes/none")
        assert info.value.not_found
    finally:
        await api.close()


async def test_kube_api_get_unreachable(tmp_path: Path) -> None:
    s = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = s.sockets[0].getsockname()[1]
    s.close()
    await s.wait_closed()
    api = await KubeApi.connect(str(kubeconfig(tmp_path, port)))
    try:
        with pytest.raises(ApiError, match="unreachable"):
            await api.get("/api/v1/nodes/x")
    finally:
        await api.close()
