"""The plugin's own HTTP/2 gRPC server (``plugin.servers.h2conn``) at its
edges: flow control both ways past the default windows, deadlines, a client
that resets its call, hostile bytes on the wire. Each test runs a real
server on a real Unix socket; grpcio's client (grpc-core) or a raw socket
speaking HTTP/2 frames by hand (``hpack`` encoding the headers) talks to it.
The kubelet's client (grpc-go) is met in the node and kind tiers."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hpack import Decoder, Encoder

from plugin.proto import registration_pb2, registration_pb2_grpc
from plugin.servers import h2wire as w
from plugin.servers.unix_server import UnixGrpcServer

REGISTRATION = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
GET_INFO = "/pluginregistration.Registration/GetInfo"


class Echo:
    """GetInfo answers with the request's size in ``name`` and a body of
    ``reply_size`` bytes in ``endpoint``; ``hold`` keeps it from answering."""

    def __init__(self) -> None:
        self.reply_size = 0
        self.hold = asyncio.Event()
        self.hold.set()
        self.entered = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.fail = False

    async def GetInfo(self, request: Any, context: Any) -> Any:
        self.entered.set()
        try:
            await self.hold.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if self.fail:
            raise RuntimeError("the servicer broke")
        return registration_pb2.PluginInfo(
            name=str(request.ByteSize()), endpoint="x" * self.reply_size
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return registration_pb2.RegistrationStatusResponse()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Echo, Path]]:
    echo = Echo()
    server = UnixGrpcServer()
    server.add_service(REGISTRATION, echo)
    sock = tmp_path / "s.sock"
    await server.start(sock)
    try:
        yield echo, sock
    finally:
        await server.stop(0)


def info_request(size: int) -> Any:
    """A request message of about ``size`` bytes (InfoRequest has no field:
    unknown fields are kept and counted by ByteSize)."""
    return registration_pb2.RegistrationStatus(error="y" * size)


async def call(sock: Path, request: Any) -> Any:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        method = ch.unary_unary(
            GET_INFO,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=registration_pb2.PluginInfo.FromString,
        )
        return await method(request, timeout=10)


async def test_a_request_and_an_answer_each_larger_than_the_windows(
    served: tuple[Echo, Path],
) -> None:
    echo, sock = served
    echo.reply_size = 3 << 20  # over the client's 64 KiB window and our 1 MiB
    reply = await call(sock, info_request(2 << 20))
    assert int(reply.name) > 2 << 20
    assert len(reply.endpoint) == 3 << 20


async def test_calls_in_parallel_on_one_connection(served: tuple[Echo, Path]) -> None:
    echo, sock = served
    echo.reply_size = 100_000
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        stub = registration_pb2_grpc.RegistrationStub(ch)
        replies = await asyncio.gather(
            *(stub.GetInfo(registration_pb2.InfoRequest(), timeout=10) for _ in range(20))
        )
    assert [len(r.endpoint) for r in replies] == [100_000] * 20


async def test_a_request_over_the_limit_fails_that_call_alone(served: tuple[Echo, Path]) -> None:
    _, sock = served
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(sock, info_request(5 << 20))
    # grpc-core refuses to send over its own 4 MiB limit, or we answer
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int((await call(sock, info_request(10))).name) > 0


async def test_a_failing_servicer_is_unknown_and_the_next_call_works(
    served: tuple[Echo, Path],
) -> None:
    echo, sock = served
    echo.fail = True
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call(sock, info_request(1))
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    echo.fail = False
    assert (await call(sock, info_request(1))).name


async def test_an_unknown_method_is_unimplemented(served: tuple[Echo, Path]) -> None:
    _, sock = served
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        method = ch.unary_unary("/no.Such/Method")
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await method(b"", timeout=5)
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/no.Such/Method" in (missing.value.details() or "")


# -- raw HTTP/2 ------------------------------------------------------------------


class Raw:
    """A client writing HTTP/2 frames by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = Encoder(), Decoder()

    @classmethod
    async def open(
        cls, sock: Path, preface: bytes = w.PREFACE, settings: dict[int, int] | None = None
    ) -> Raw:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(preface + w.settings(settings or {}))
        return cls(reader, writer)

    def request(
        self, sid: int, path: str, body: bytes, *, compressed: int = 0, timeout: str = ""
    ) -> None:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                  ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip
        if timeout:
            fields.append(("grpc-timeout", timeout))
        block = self.encoder.encode(fields)
        message = struct.pack(">BL", compressed, len(body)) + body
        self.writer.write(
            w.frame(w.HEADERS, w.END_HEADERS, sid, block)
            + w.frame(w.DATA, w.END_STREAM, sid, message)
        )

    async def frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        lt, flags, sid = w.HEAD.unpack(head)
        payload = await self.reader.readexactly(lt >> 8)
        return lt & 0xFF, flags, sid, payload

    async def until(self, ftype: int, sid: int | None = None) -> tuple[int, bytes]:
        """The flags and payload of the next frame of ``ftype`` (on ``sid``)."""
        async with asyncio.timeout(5):
            while True:
                t, flags, s, payload = await self.frame()
                if t == ftype and (sid is None or s == sid):
                    return flags, payload

    async def trailers(self, sid: int) -> dict[bytes, bytes]:
        """The fields of the HEADERS that end stream ``sid``."""
        while True:
            flags, block = await self.until(w.HEADERS, sid)
            fields = dict(self.decoder.decode(block, raw=True))
            if flags & w.END_STREAM:
                return fields

    async def goaway(self) -> int:
        _, payload = await self.until(w.GOAWAY)
        return int(struct.unpack(">L", payload[4:8])[0])


async def test_a_wrong_preface_gets_goaway_and_a_closed_connection(
    served: tuple[Echo, Path],
) -> None:
    _, sock = served
    raw = await Raw.open(sock, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await raw.goaway() == w.PROTOCOL_ERROR
    assert await raw.reader.read() == b""  # closed
    assert (await call(sock, info_request(1))).name  # others are served


async def test_a_frame_over_16_kib_is_a_frame_size_error(served: tuple[Echo, Path]) -> None:
    _, sock = served
    raw = await Raw.open(sock)
    raw.writer.write(w.frame(w.DATA, 0, 1, b"z" * 20_000))
    assert await raw.goaway() == w.FRAME_SIZE_ERROR


async def test_a_broken_header_block_is_a_compression_error(served: tuple[Echo, Path]) -> None:
    _, sock = served
    raw = await Raw.open(sock)
    raw.writer.write(w.frame(w.HEADERS, w.END_HEADERS, 1, b"\xff\xff\xff\xff\xff\xff"))
    assert await raw.goaway() == w.COMPRESSION_ERROR


async def test_ping_is_answered_with_its_payload(served: tuple[Echo, Path]) -> None:
    _, sock = served
    raw = await Raw.open(sock)
    raw.writer.write(w.frame(w.PING, 0, 0, b"12345678"))
    flags, payload = await raw.until(w.PING)
    assert (flags & w.ACK, payload) == (w.ACK, b"12345678")


async def test_a_compressed_or_cut_message_fails_its_call_and_the_next_is_served(
    served: tuple[Echo, Path],
) -> None:
    _, sock = served
    raw = await Raw.open(sock)
    raw.request(1, GET_INFO, b"", compressed=1)
    assert (await raw.trailers(1))[b"grpc-status"] == b"12"  # UNIMPLEMENTED
    raw.request(3, GET_INFO, b"")
    raw.writer.write(w.frame(w.DATA, w.END_STREAM, 5, b""))  # no stream 5: ignored
    trailers = await raw.trailers(3)
    assert trailers[b"grpc-status"] == b"0"


async def held_call(echo: Echo, sock: Path) -> Raw:
    """A connection whose call on stream 1 is inside its servicer, held there."""
    echo.hold.clear()
    raw = await Raw.open(sock)
    raw.request(1, GET_INFO, b"")
    async with asyncio.timeout(5):
        await echo.entered.wait()
    return raw


async def test_a_reset_call_cancels_its_servicer(served: tuple[Echo, Path]) -> None:
    echo, sock = served
    raw = await held_call(echo, sock)
    raw.writer.write(w.rst_stream(1, w.CANCEL))
    async with asyncio.timeout(5):
        await echo.cancelled.wait()


async def test_a_passed_deadline_cancels_the_servicer_and_answers_so(
    served: tuple[Echo, Path],
) -> None:
    echo, sock = served
    echo.hold.clear()
    raw = await Raw.open(sock)
    raw.request(1, GET_INFO, b"", timeout="200m")  # and never resets the call
    assert (await raw.trailers(1))[b"grpc-status"] == b"4"  # DEADLINE_EXCEEDED
    assert echo.cancelled.is_set()


async def test_the_answer_waits_for_the_clients_window(served: tuple[Echo, Path]) -> None:
    echo, sock = served
    echo.reply_size = 5000
    raw = await Raw.open(sock, settings={w.INITIAL_WINDOW_SIZE: 1000})
    raw.request(1, GET_INFO, b"")
    got = 0
    while got < 1000:
        got += len((await raw.until(w.DATA, 1))[1])
    assert got == 1000
    # Nothing more comes before the window grows: a PING's answer overtakes.
    raw.writer.write(w.frame(w.PING, 0, 0, b"abcdefgh"))
    async with asyncio.timeout(5):
        while True:
            t, flags, _, payload = await raw.frame()
            assert t != w.DATA, "DATA beyond the client's window"
            if t == w.PING:
                break
    raw.writer.write(w.window_update(1, 100_000))
    async with asyncio.timeout(5):
        while True:
            t, flags, _, payload = await raw.frame()
            if t == w.DATA:
                got += len(payload)
            elif t == w.HEADERS and flags & w.END_STREAM:
                assert dict(raw.decoder.decode(payload, raw=True))[b"grpc-status"] == b"0"
                break
    assert got == 5 + registration_pb2.PluginInfo(name="0", endpoint="x" * 5000).ByteSize()


async def test_a_deadline_already_passed_is_answered_so(served: tuple[Echo, Path]) -> None:
    echo, sock = served
    raw = await Raw.open(sock)
    raw.request(1, GET_INFO, b"", timeout="0n")
    assert (await raw.trailers(1))[b"grpc-status"] == b"4"
    assert not echo.entered.is_set()


async def test_enable_push_other_than_0_or_1_is_a_protocol_error(
    served: tuple[Echo, Path],
) -> None:
    _, sock = served
    raw = await Raw.open(sock, settings={w.ENABLE_PUSH: 2})
    assert await raw.goaway() == w.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("increment", "error"), [(0, w.PROTOCOL_ERROR), (w.MAX_WINDOW, w.FLOW_CONTROL_ERROR)]
)
async def test_a_bad_stream_window_update_resets_that_call_alone(
    served: tuple[Echo, Path], increment: int, error: int
) -> None:
    echo, sock = served
    raw = await held_call(echo, sock)
    raw.writer.write(w.window_update(1, increment))
    _, payload = await raw.until(w.RST_STREAM, 1)
    assert struct.unpack(">L", payload)[0] == error
    async with asyncio.timeout(5):
        await echo.cancelled.wait()
    echo.hold.set()
    raw.request(3, GET_INFO, b"")  # the connection serves on
    assert (await raw.trailers(3))[b"grpc-status"] == b"0"


async def test_a_settings_change_that_overflows_a_window_is_a_flow_control_error(
    served: tuple[Echo, Path],
) -> None:
    """RFC 9113 section 6.9.2: a new SETTINGS_INITIAL_WINDOW_SIZE that takes an
    open stream's window over 2^31-1 is a connection error."""
    echo, sock = served
    raw = await held_call(echo, sock)
    raw.writer.write(w.window_update(1, w.MAX_WINDOW - 65535))  # at the limit, allowed
    raw.writer.write(w.settings({w.INITIAL_WINDOW_SIZE: 65536}))  # one over it
    assert await raw.goaway() == w.FLOW_CONTROL_ERROR
