"""The lean HTTP/1.1 client (driver/kube/http1.py) against a real server on
a local socket: bodies by length and chunked, kept connections reused, a
kept connection the server closed retried once for GET only, a dead idle
one dropped before any write, ``Connection: close`` honoured, request
bodies sent with their length, and streamed answers split into lines
across chunks, ended by the server, broken off, and cancelled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from driver.kube import http1
from driver.kube.http1 import Http1Client
from tests.unit.local_http import Start, chunked_answer, length_answer, serving


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    async with serving() as start:
        yield start


async def test_a_kept_connection_serves_the_next_get(serve: Start) -> None:
    srv = await serve(lambda _: length_answer(b'{"a": 1}'))
    client = Http1Client(srv.url, None)
    assert await client.get("/x", {"Accept": "application/json"}) == (200, b'{"a": 1}')
    assert await client.get("/y", {}) == (200, b'{"a": 1}')
    assert srv.connections == 1
    assert srv.requests[0].startswith(b"GET /x HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{srv.port}\r\n".encode() in srv.requests[0]
    assert b"Accept: application/json\r\n" in srv.requests[0]
    await client.close()


async def test_a_chunked_body_is_joined(serve: Start) -> None:
    body = json.dumps({"items": list(range(40))}).encode()
    srv = await serve(lambda _: chunked_answer(*(body[i : i + 7] for i in range(0, len(body), 7))))
    client = Http1Client(srv.url, None)
    for _ in range(2):  # the connection is positioned after the last chunk
        assert await client.get("/list", {}) == (200, body)
    assert srv.connections == 1
    await client.close()


async def test_a_body_is_sent_with_its_length_on_the_kept_connection(serve: Start) -> None:
    srv = await serve(lambda _: length_answer(b'{"ok": true}', status="201 Created"))
    client = Http1Client(srv.url + "/prefix/", None)
    for method in ("POST", "PUT", "PATCH"):
        assert await client.request(method, "/o", {}, b'{"x": 1}') == (201, b'{"ok": true}')
    assert await client.request("DELETE", "/o", {}) == (201, b'{"ok": true}')
    assert srv.connections == 1
    assert srv.requests[0].startswith(b"POST /prefix/o HTTP/1.1\r\n")
    assert b"Content-Length: 8\r\n" in srv.requests[0]
    assert srv.bodies == [b'{"x": 1}'] * 3 + [b""]
    assert b"Content-Length" not in srv.requests[3]
    await client.close()


async def test_a_connection_the_server_closed_is_retried_on_a_new_one(serve: Start) -> None:
    srv = await serve(lambda _: length_answer(b"{}"), close_after=1)
    client = Http1Client(srv.url, None)
    assert await client.get("/a", {}) == (200, b"{}")
    async with asyncio.timeout(5):
        await srv.closed.wait()  # the server has closed the kept connection
    assert await client.get("/b", {}) == (200, b"{}")
    assert srv.connections == 2
    await client.close()


async def test_a_write_after_an_idle_close_goes_on_a_new_connection(serve: Start) -> None:
    """The idle connection is seen closed before anything is written, so a
    POST (never retried) is sent once, on a new connection."""
    srv = await serve(lambda _: length_answer(b"{}"), close_after=1)
    client = Http1Client(srv.url, None)
    await client.get("/a", {})
    async with asyncio.timeout(5):
        await srv.closed.wait()
        # the loop has read the server's FIN (a StreamReader has no event for it)
        while not client._idle[0][0].at_eof():  # noqa: ASYNC110
            await asyncio.sleep(0)
    assert await client.request("POST", "/b", {}, b"{}") == (200, b"{}")
    assert srv.connections == 2 and len(srv.requests) == 2
    await client.close()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_only_a_get_is_retried_when_a_kept_connection_dies_unanswered(
    serve: Start, method: str
) -> None:
    """The server reads the second request on the kept connection and hangs
    up without an answer: it may have acted on it, so only GET goes again."""
    seen: list[bytes] = []

    def answer(head: bytes) -> bytes | None:
        seen.append(head)
        return None if len(seen) == 2 else length_answer(b"{}")

    srv = await serve(answer)
    client = Http1Client(srv.url, None)
    await client.get("/first", {})
    if method == "GET":
        assert await client.request(method, "/again", {}) == (200, b"{}")
        assert srv.connections == 2 and len(seen) == 3
    else:
        with pytest.raises(ConnectionError, match="no answer"):
            await client.request(method, "/once", {}, b"{}")
        assert srv.connections == 1 and len(seen) == 2
    await client.close()


async def test_connection_close_is_not_kept(serve: Start) -> None:
    srv = await serve(lambda _: length_answer(b"{}", extra="Connection: close\r\n"))
    client = Http1Client(srv.url, None)
    await client.get("/a", {})
    await client.get("/b", {})
    assert srv.connections == 2
    await client.close()


async def test_a_malformed_answer_is_a_connection_error(serve: Start) -> None:
    srv = await serve(lambda _: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    client = Http1Client(srv.url, None)
    with pytest.raises(ConnectionError, match="chunk size"):
        await client.get("/a", {})
    assert not client._idle
    await client.close()


EVENTS = [{"type": "ADDED", "object": {"n": i, "pad": "x" * 50}} for i in range(3)]
STREAM = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)


async def test_a_stream_splits_lines_across_chunks_and_ends_with_the_body(serve: Start) -> None:
    pieces = [STREAM[i : i + 13] for i in range(0, len(STREAM), 13)]  # mid-event cuts
    srv = await serve(lambda _: chunked_answer(*pieces))
    client = Http1Client(srv.url, None)
    resp = await client.stream("GET", "/watch", {})
    assert resp.status == 200
    assert [json.loads(line) async for line in resp.lines()] == EVENTS
    async with asyncio.timeout(5):
        await srv.closed.wait()  # the stream's connection is closed, not kept
    assert not client._idle
    await client.close()


async def test_a_stream_that_breaks_off_raises(serve: Start) -> None:
    srv = await serve(lambda _: chunked_answer(STREAM[:30], last=False) + b"40\r\nabc", 1)
    client = Http1Client(srv.url, None)
    resp = await client.stream("GET", "/watch", {})
    with pytest.raises(ConnectionError, match="broke off"):
        async for _ in resp.lines():
            pass
    await client.close()


async def test_cancelling_a_stream_reader_closes_its_connection(serve: Start) -> None:
    srv = await serve(lambda _: chunked_answer(STREAM, last=False))  # then nothing more
    client = Http1Client(srv.url, None)
    resp = await client.stream("GET", "/watch", {})
    got: list[bytes] = []
    three = asyncio.Event()

    async def consume() -> None:
        async for line in resp.lines():
            got.append(line)
            if len(got) == 3:
                three.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await three.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await srv.closed.wait()  # the server saw the connection close
    await client.close()


async def test_a_stream_past_its_deadline_times_out(serve: Start) -> None:
    srv = await serve(lambda _: chunked_answer(last=False))  # the head, then nothing
    client = Http1Client(srv.url, None)
    resp = await client.stream("GET", "/watch", {})
    lines = resp.lines(asyncio.get_running_loop().time())  # already due: the first read
    with pytest.raises(TimeoutError):
        await anext(lines)
    async with asyncio.timeout(5):
        await srv.closed.wait()
    await client.close()


async def test_requests_past_the_limit_wait_for_a_kept_connection(
    serve: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three GETs at once with room for two: the third waits, then takes a
    connection one of the first two left kept (without the limit each of the
    three opens its own: nothing is kept yet when they start)."""
    monkeypatch.setattr(http1, "MAX_OPEN", 2)
    srv = await serve(lambda _: length_answer(b"{}"))
    client = Http1Client(srv.url, None)
    answers = await asyncio.gather(*(client.get(f"/{i}", {}) for i in range(3)))
    assert answers == [(200, b"{}")] * 3
    assert srv.connections == 2
    await client.close()
