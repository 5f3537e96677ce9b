"""One HTTP/2 connection of the plugin's gRPC server, as an asyncio protocol.

Why this module exists: grpclib and h2 spent more CPU on each kubelet call
than the plugin's own work on the claim: h2's state machine on every frame,
its HPACK encoder on every response, three socket writes per answer, a task
and several futures per stream (issue 36; docs/figures.md). A gRPC server
on a Unix socket needs a small part of HTTP/2: requests come as HEADERS and
DATA, answers go out as HEADERS, DATA and trailing HEADERS, written here in
one socket write when the peer's windows allow. Request headers are decoded
by ``plugin.servers.h2headers`` (RFC 7541, checked against the ``hpack``
library's encoder and decoder); what the server sends is fixed bytes
(``plugin.servers.h2wire``).

What it does, by RFC 9113: the preface and SETTINGS both ways (ours: stream
windows of 1 MiB, at most 256 streams, a header list of 16 KiB), PING
answered, WINDOW_UPDATE both ways with the peer's flow control honoured on
every DATA frame we send, RST_STREAM cancelling that call's task, GOAWAY
from the peer letting open calls finish, padding and CONTINUATION accepted.
A connection error (a bad preface, a frame over 16 KiB, a broken header
block, a window overrun, a frame out of order, a bad setting) ends the
connection with GOAWAY naming the error; it never touches other connections.
A stream error (a WINDOW_UPDATE of 0 or past 2^31-1 on a call) resets that
call alone, and a request body over ``MAX_MESSAGE`` ends it with
RESOURCE_EXHAUSTED.

Concurrency model: callbacks on the process's asyncio loop; the only
awaiting is :meth:`H2Connection.send_message` waiting for window.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from driver.errors import WireError
from plugin.servers import h2wire as w
from plugin.servers.h2headers import HeaderBlocks

log = logging.getLogger(__name__)

STREAM_WINDOW = 1 << 20  # our SETTINGS_INITIAL_WINDOW_SIZE
CONN_WINDOW = 1 << 20  # the connection's receive window we keep open
MAX_STREAMS = 256
MAX_HEADER_LIST = 16 << 10
MAX_MESSAGE = (4 << 20) + 5  # gRPC's default receive limit, plus its prefix


class H2Stream:
    """One request: its headers and body, and what the answer has used."""

    __slots__ = (
        "body", "discard", "ended", "headers", "headers_sent", "id", "recv_unacked",
        "remote_done", "task", "window",
    )  # fmt: skip

    def __init__(self, stream_id: int, window: int) -> None:
        self.id = stream_id
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.window = window  # what we may still send on it
        self.recv_unacked = 0
        self.task: asyncio.Task[None] | None = None
        self.remote_done = False
        self.headers_sent = False
        self.ended = False
        self.discard = False  # refused: its remaining DATA only feeds flow control


class H2Connection(asyncio.Protocol):
    """The server side of one connection; ``on_request(conn, stream)`` is
    called once a stream's request is complete (its END_STREAM received)."""

    def __init__(self, on_request: Callable[[H2Connection, H2Stream], None]) -> None:
        self._on_request = on_request
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = True
        self._blocks = HeaderBlocks(MAX_HEADER_LIST)
        self._streams: dict[int, H2Stream] = {}
        self._last_id = 0
        self._send_window = w.DEFAULT_WINDOW
        self._peer_initial = w.DEFAULT_WINDOW
        self._peer_frame = w.DEFAULT_FRAME_SIZE
        self._recv_window = w.DEFAULT_WINDOW
        self._table_update = b""  # a size update owed at the head of our next block
        self._waiters: list[asyncio.Future[None]] = []
        self._going_away = False
        self.closed = False

    # -- asyncio.Protocol ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        ours = {w.MAX_CONCURRENT_STREAMS: MAX_STREAMS, w.INITIAL_WINDOW_SIZE: STREAM_WINDOW}
        ours[w.MAX_HEADER_LIST_SIZE] = MAX_HEADER_LIST
        self._transport.write(w.settings(ours) + w.window_update(0, CONN_WINDOW - w.DEFAULT_WINDOW))
        self._recv_window = CONN_WINDOW

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()  # the caller is gone
        self._streams.clear()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        buf = self._buf
        buf += data
        if self._preface:
            if len(buf) < len(w.PREFACE):
                if not w.PREFACE.startswith(bytes(buf)):
                    self._fail(w.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if bytes(buf[: len(w.PREFACE)]) != w.PREFACE:
                self._fail(w.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            del buf[: len(w.PREFACE)]
            self._preface = False
        out: list[bytes] = []
        pos, end = 0, len(buf)
        while end - pos >= 9 and not self.closed:
            head, flags, sid = w.HEAD.unpack_from(buf, pos)
            length, ftype = head >> 8, head & 0xFF
            if length > w.DEFAULT_FRAME_SIZE:
                self._fail(w.FRAME_SIZE_ERROR, f"a frame of {length} bytes (at most 16384)")
                return
            if end - pos < 9 + length:
                break
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            error = self._frame(ftype, flags, sid & w.MAX_WINDOW, payload, out)
            if error is not None:
                self._fail(*error)
                return
        del buf[:pos]
        if out and self._transport is not None:
            self._transport.write(b"".join(out))

    # -- frames in -------------------------------------------------------------

    def _frame(
        self, ftype: int, flags: int, sid: int, payload: bytes, out: list[bytes]
    ) -> tuple[int, str] | None:
        if self._blocks.open and ftype != w.CONTINUATION:
            return w.PROTOCOL_ERROR, "a frame inside a header block"
        if ftype == w.DATA:
            return self._data(flags, sid, payload, out)
        if ftype in (w.HEADERS, w.CONTINUATION):
            return self._headers(ftype, flags, sid, payload, out)
        if ftype == w.SETTINGS:
            return self._settings(flags, sid, payload, out)
        if ftype == w.WINDOW_UPDATE:
            return self._window_update(sid, payload, out)
        if ftype == w.PING:
            if sid or len(payload) != 8:
                return w.PROTOCOL_ERROR, "a malformed PING"
            if not flags & w.ACK:
                out.append(w.frame(w.PING, w.ACK, 0, payload))
        elif ftype == w.RST_STREAM:
            self._drop(sid)
        elif ftype == w.GOAWAY:
            self._going_away = True
            self._close_if_idle()
        elif ftype == w.PUSH_PROMISE:
            return w.PROTOCOL_ERROR, "PUSH_PROMISE from a client"
        return None  # PRIORITY and unknown types are ignored

    def _data(
        self, flags: int, sid: int, payload: bytes, out: list[bytes]
    ) -> tuple[int, str] | None:
        if sid == 0:
            return w.PROTOCOL_ERROR, "DATA on stream 0"
        self._recv_window -= len(payload)
        if self._recv_window < 0:
            return w.FLOW_CONTROL_ERROR, "DATA beyond the connection's window"
        if self._recv_window < CONN_WINDOW // 2:
            out.append(w.window_update(0, CONN_WINDOW - self._recv_window))
            self._recv_window = CONN_WINDOW
        stream = self._streams.get(sid)
        if stream is None or stream.remote_done:
            return None  # reset or finished: the frame only counted above
        body = w.unpad(payload, flags)
        if body is None:
            return w.PROTOCOL_ERROR, "DATA padding longer than the frame"
        stream.recv_unacked += len(payload)
        if stream.recv_unacked > STREAM_WINDOW:
            return w.FLOW_CONTROL_ERROR, f"DATA beyond stream {sid}'s window"
        if not stream.discard:
            if len(stream.body) + len(body) > MAX_MESSAGE:
                stream.discard = True
                stream.body.clear()
                self.end(stream, w.status_trailers(w.RESOURCE_EXHAUSTED, "request over 4 MiB"))
            else:
                stream.body += body
        if flags & w.END_STREAM:
            self._remote_done(stream)
        elif stream.recv_unacked >= STREAM_WINDOW // 2:
            out.append(w.window_update(sid, stream.recv_unacked))
            stream.recv_unacked = 0
        return None

    def _headers(
        self, ftype: int, flags: int, sid: int, payload: bytes, out: list[bytes]
    ) -> tuple[int, str] | None:
        try:
            block = self._blocks.frame(ftype, flags, sid, payload)
        except WireError as exc:
            return exc.code, str(exc)
        return None if block is None else self._header_block(*block, out)

    def _header_block(
        self, sid: int, flags: int, fields: list[tuple[bytes, bytes]], out: list[bytes]
    ) -> tuple[int, str] | None:
        stream = self._streams.get(sid)
        if stream is not None:  # trailers from the client
            if flags & w.END_STREAM and not stream.remote_done:
                self._remote_done(stream)
            return None
        if sid <= self._last_id:
            return None  # a stream we already closed
        self._last_id = sid
        stream = H2Stream(sid, self._peer_initial)
        stream.headers = dict(fields)
        if self._going_away or len(self._streams) >= MAX_STREAMS:
            out.append(w.rst_stream(sid, w.REFUSED_STREAM))
            return None
        self._streams[sid] = stream
        if flags & w.END_STREAM:
            self._remote_done(stream)
        return None

    def _remote_done(self, stream: H2Stream) -> None:
        stream.remote_done = True
        if stream.ended:
            self._streams.pop(stream.id, None)
            self._close_if_idle()
        elif not stream.discard:
            self._on_request(self, stream)

    def _settings(
        self, flags: int, sid: int, payload: bytes, out: list[bytes]
    ) -> tuple[int, str] | None:
        if sid:
            return w.PROTOCOL_ERROR, "SETTINGS on a stream"
        if flags & w.ACK:
            return None
        pairs = w.parse_settings(payload)
        if pairs is None:
            return w.FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6"
        for key, value in pairs:
            if key == w.INITIAL_WINDOW_SIZE:
                if value > w.MAX_WINDOW:
                    return w.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1"
                delta, self._peer_initial = value - self._peer_initial, value
                for stream in self._streams.values():
                    stream.window += delta
                    if stream.window > w.MAX_WINDOW:  # RFC 9113 section 6.9.2
                        return w.FLOW_CONTROL_ERROR, f"stream {stream.id}'s window over 2^31-1"
            elif key == w.MAX_FRAME_SIZE:
                if not w.DEFAULT_FRAME_SIZE <= value < 1 << 24:
                    return w.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}"
                self._peer_frame = value
            elif key == w.ENABLE_PUSH and value > 1:
                return w.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}"
            elif key == w.HEADER_TABLE_SIZE and value < 4096:
                # Our blocks never index, but the peer's decoder must hear
                # that our table shrank (RFC 7541 section 4.2).
                self._table_update = w.table_size_update(value)
        out.append(w.frame(w.SETTINGS, w.ACK, 0))
        self._wake()
        return None

    def _drop(self, sid: int) -> None:
        """Forget stream ``sid`` and cancel its call (reset by either side)."""
        stream = self._streams.pop(sid, None)
        if stream is not None and stream.task is not None:
            stream.task.cancel()

    def _window_update(self, sid: int, payload: bytes, out: list[bytes]) -> tuple[int, str] | None:
        if len(payload) != 4:
            return w.FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes"
        increment = w.u32(payload)
        if sid == 0:
            if not increment:
                return w.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0"
            self._send_window += increment
            if self._send_window > w.MAX_WINDOW:
                return w.FLOW_CONTROL_ERROR, "the connection's window over 2^31-1"
        else:
            stream = self._streams.get(sid)
            if stream is not None:
                if not increment or stream.window + increment > w.MAX_WINDOW:  # a stream error
                    out.append(
                        w.rst_stream(sid, w.FLOW_CONTROL_ERROR if increment else w.PROTOCOL_ERROR)
                    )
                    self._drop(sid)
                    return None
                stream.window += increment
        self._wake()
        return None

    # -- frames out --------------------------------------------------------------

    def _head_block(self, block: bytes) -> bytes:
        if self._table_update:
            block, self._table_update = self._table_update + block, b""
        return block

    async def send_message(self, stream: H2Stream, data: bytes, trailers: bytes | None) -> None:
        """Send ``data`` (a length-prefixed gRPC message) as DATA frames, the
        response headers first if not yet sent; with ``trailers``, end the
        stream after it, in the same write when the windows allow."""
        out = []
        if not stream.headers_sent:
            block = self._head_block(w.RESPONSE_HEADERS)
            out.append(w.frame(w.HEADERS, w.END_HEADERS, stream.id, block))
            stream.headers_sent = True
        view = memoryview(data)
        while view:
            room = min(self._send_window, stream.window, self._peer_frame)
            if room <= 0:
                self._write(out)
                out = []
                await self._room(stream)
                continue
            chunk, view = view[:room], view[room:]
            self._send_window -= len(chunk)
            stream.window -= len(chunk)
            out.append(w.frame(w.DATA, 0, stream.id, bytes(chunk)))
        if trailers is not None:
            out.append(self._end_frames(stream, trailers))
        self._write(out)

    def end(self, stream: H2Stream, trailers: bytes) -> None:
        """End ``stream`` with ``trailers`` (headers and trailers in one
        block if no message went out: a trailers-only response)."""
        self._write([self._end_frames(stream, trailers)])

    def _end_frames(self, stream: H2Stream, trailers: bytes) -> bytes:
        if stream.ended:
            return b""
        stream.ended = True
        if not stream.headers_sent:
            trailers = w.RESPONSE_HEADERS + trailers
            stream.headers_sent = True
        flags = w.END_HEADERS | w.END_STREAM
        frames = w.frame(w.HEADERS, flags, stream.id, self._head_block(trailers))
        if not stream.remote_done:
            frames += w.rst_stream(stream.id, w.NO_ERROR)  # we do not read the rest
        self._streams.pop(stream.id, None)
        self._close_if_idle()
        return frames

    def _write(self, frames: list[bytes]) -> None:
        if frames and self._transport is not None and not self.closed:
            self._transport.write(b"".join(frames))

    async def _room(self, stream: H2Stream) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter
        if self.closed or stream.id not in self._streams:
            raise ConnectionResetError(f"stream {stream.id} closed while sending")

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- closing ------------------------------------------------------------------

    def goaway(self) -> None:
        """Tell the peer no new stream will be taken; close once the open ones end."""
        if self._transport is not None and not self.closed:
            self._transport.write(w.goaway(self._last_id, w.NO_ERROR))
        self._going_away = True
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self._going_away and not self._streams and self._transport is not None:
            self._transport.close()

    def _fail(self, code: int, reason: str) -> None:
        log.warning("closing a gRPC connection: %s", reason)
        if self._transport is not None and not self.closed:
            self._transport.write(w.goaway(self._last_id, code, reason.encode()))
            self._transport.close()
        self.closed = True
