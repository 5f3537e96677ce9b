"""Fuzzing the plugin's HTTP/2 connection (``plugin.servers.h2conn``) below
the socket: whatever bytes arrive, in whatever pieces, the connection never
raises into the event loop, and it either answers or ends with GOAWAY.

Why it exists: the server parses every frame itself since issue 36; a parser
bug must cost one connection, never the plugin. A kubelet's request split
into arbitrary pieces must be read exactly as when it comes whole.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from hpack import Encoder
from hypothesis import given
from hypothesis import strategies as st

from plugin.servers import h2wire as w
from plugin.servers.h2conn import H2Connection, H2Stream
from tests.fuzzing import FUZZ


class Transport:
    """What the connection writes, and whether it closed."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True


def connection() -> tuple[H2Connection, Transport, list[H2Stream]]:
    requests: list[H2Stream] = []
    conn = H2Connection(lambda _, stream: requests.append(stream))
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport, requests


def frames_written(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        lt, flags, sid = w.HEAD.unpack_from(data, pos)
        out.append((lt & 0xFF, flags, sid, data[pos + 9 : pos + 9 + (lt >> 8)]))
        pos += 9 + (lt >> 8)
    return out


def request_bytes(body: bytes, window: int = 1 << 20) -> bytes:
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/a.B/C"), (":authority", "x"),
              ("content-type", "application/grpc"), ("grpc-timeout", "5S")]  # fmt: skip
    block = Encoder().encode(fields)
    message = struct.pack(">BL", 0, len(body)) + body
    data = w.frame(w.HEADERS, w.END_HEADERS, 1, block)
    for i in range(0, len(message), 1000):  # DATA in pieces, the last ending the stream
        last = i + 1000 >= len(message)
        data += w.frame(w.DATA, w.END_STREAM if last else 0, 1, message[i : i + 1000])
    return w.PREFACE + w.settings({w.INITIAL_WINDOW_SIZE: window}) + data


@FUZZ
@given(body=st.binary(max_size=5000), cuts=st.lists(st.integers(0, 8000), max_size=12))
def test_a_request_in_any_pieces_is_read_as_when_whole(body: bytes, cuts: list[int]) -> None:
    data = request_bytes(body)
    conn, transport, requests = connection()
    start = 0
    for cut in sorted({min(c, len(data)) for c in cuts} | {len(data)}):
        conn.data_received(data[start:cut])
        start = cut
    assert not transport.closed
    assert len(requests) == 1
    stream = requests[0]
    assert bytes(stream.body) == struct.pack(">BL", 0, len(body)) + body
    assert stream.headers[b":path"] == b"/a.B/C"
    written = frames_written(bytes(transport.out))
    assert (w.SETTINGS, w.ACK) in [(t, f) for t, f, _, _ in written]


@FUZZ
@given(noise=st.binary(max_size=400), at=st.integers(0, 400))
def test_any_bytes_after_the_preface_end_in_answers_or_goaway_never_a_raise(
    noise: bytes, at: int
) -> None:
    conn, transport, _ = connection()
    data = request_bytes(b"abc")
    at = min(at, len(data))
    conn.data_received(data[:at] + noise)  # must not raise
    conn.data_received(data[at:])
    written = frames_written(bytes(transport.out))
    if transport.closed:
        assert written[-1][0] == w.GOAWAY  # the connection said why it ended
        assert conn.closed


@FUZZ
@given(frames=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 255), st.integers(0, 9),
                                 st.binary(max_size=40)), max_size=12))  # fmt: skip
def test_random_frames_never_raise(frames: list[tuple[int, int, int, bytes]]) -> None:
    conn, _, requests = connection()
    data = w.PREFACE + b"".join(w.frame(t, f, s, p) for t, f, s, p in frames)
    conn.data_received(data)
    for stream in requests:  # answering what came must not raise either
        conn.end(stream, w.OK_TRAILERS)
    conn.connection_lost(None)
    assert conn.closed


def test_an_answer_waits_while_the_window_is_shut_then_goes_on() -> None:
    async def run() -> Any:
        conn, transport, requests = connection()
        conn.data_received(request_bytes(b"x", window=0))
        sending = asyncio.ensure_future(conn.send_message(requests[0], b"y" * 10, w.OK_TRAILERS))
        await asyncio.sleep(0)
        assert not sending.done()
        assert [t for t, *_ in frames_written(bytes(transport.out))].count(w.DATA) == 0
        conn.data_received(w.window_update(1, 100))
        await asyncio.wait_for(sending, 5)
        kinds = [t for t, *_ in frames_written(bytes(transport.out))]
        assert kinds.count(w.DATA) == 1 and kinds[-1] == w.HEADERS

    asyncio.run(run())
