"""The endpoint server (driver.http1server) over real sockets on loopback:
what Prometheus and kubelet probes send, and what it must refuse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest

from driver import http1server
from driver.http1server import GetServer, Handler, Reply

T = TypeVar("T")


def boom() -> Reply:
    raise RuntimeError("collector failed")


async def slow() -> Reply:
    await asyncio.sleep(0)
    return Reply(503, b"not ready\n")


def metrics() -> Reply:
    return Reply(200, b"up 1\n", "text/plain; version=0.0.4")


ROUTES: dict[str, Handler] = {"/metrics": metrics, "/healthz": slow, "/boom": boom}


@asynccontextmanager
async def served() -> AsyncIterator[int]:
    server = await GetServer(ROUTES).start("127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def exchange(port: int, *requests: bytes) -> bytes:
    """Send the requests on one connection; everything read until it closes
    (nothing, where the server reset it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for r in requests:
            writer.write(r)
        await writer.drain()
        return await reader.read(-1)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def get(path: str, extra: str = "", version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_keep_alive_serves_requests_in_turn_until_close() -> None:
    async def go() -> bytes:
        async with served() as port:
            return await exchange(
                port, get("/metrics?x=1"), get("/healthz", "Connection: close\r\n")
            )

    out = run(go())
    first, second = out.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK\r\n") and b"Content-Type: text/plain; version=0.0.4" in first
    assert b"Content-Length: 5\r\nConnection: keep-alive\r\n\r\nup 1\n" in first
    assert second.startswith(b"503 Service Unavailable") and second.endswith(b"not ready\n")
    assert b"Connection: close" in second


def test_http10_closes_and_head_has_no_body() -> None:
    async def go() -> bytes:
        async with served() as port:
            return await exchange(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")

    out = run(go())
    assert out.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 5\r\n" in out
    assert out.endswith(b"\r\n\r\n")  # the length of the body, not the body


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (b"POST /metrics HTTP/1.1\r\n\r\n", b"405", b"POST is not served"),
        (get("/nope"), b"404", b"no /nope; try /metrics, /healthz, /boom"),
        (b"GET /metrics\r\n\r\n", b"400", b"bad request line"),
        (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", b"400", b"bad header line"),
        (get("/metrics", "Content-Length: 3\r\n") + b"abc", b"400", b"request body"),
        (get("/metrics", "Transfer-Encoding: chunked\r\n"), b"400", b"request body"),
        (get("/metrics", "X: " + "a" * 9000 + "\r\n"), b"431", b"head too large"),
        (get("/boom"), b"500", b"internal error"),
    ],
)
def test_refusals_name_the_reason(request_bytes: bytes, status: bytes, says: bytes) -> None:
    async def go() -> bytes:
        async with served() as port:
            return await exchange(port, request_bytes, get("/metrics", "Connection: close\r\n"))

    out = run(go())
    assert out.startswith(b"HTTP/1.1 " + status) and says in out
    # a 4xx ends the connection, unread requests behind it are not served;
    # a handler's failure (500) is answered and the connection goes on
    assert out.count(b"HTTP/1.1 ") == (2 if status in (b"405", b"404", b"500") else 1)


def test_a_stalled_client_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1server, "HEAD_TIMEOUT_S", 0.05)

    async def go() -> bytes:
        async with served() as port:
            return await exchange(port, b"GET /metr")

    assert run(go()) == b""  # closed without an answer, nothing served


def test_connections_past_the_limit_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1server, "MAX_CONNECTIONS", 2)

    async def go() -> tuple[bytes, bytes]:
        async with served() as port:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            for _, w in held:  # both are being served (a request each, kept alive)
                w.write(get("/metrics"))
            for r, _ in held:
                await r.readuntil(b"up 1\n")
            refused = await exchange(port, get("/metrics"))
            held[0][1].close()
            await held[0][1].wait_closed()
            await held[0][0].read(-1)  # the server saw it go, and counted it out first
            served_again = await exchange(port, get("/metrics", "Connection: close\r\n"))
            held[1][1].close()
            return refused, served_again

    refused, again = run(go())
    assert refused == b""
    assert again.startswith(b"HTTP/1.1 200 OK")
