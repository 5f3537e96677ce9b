"""A gRPC server on one Unix socket that costs nothing while no call comes.

Why this module exists: grpc-core (``grpc.aio``) keeps timers and worker
threads running in every process that has a server, whether or not a call
ever comes (6-10 wake-ups a second, 0.03-0.04 % of a core: over an idle
plugin's whole budget; issue 26, docs/figures.md), and no setting of grpcio
stops them. grpclib, which served here until issue 36, spent more CPU per
call in h2 than the plugin spent on the claim. This server speaks gRPC's
HTTP/2 wire protocol itself (``plugin.servers.h2conn``) from the asyncio loop:
no thread, no timer, nothing runs between calls, and one socket write per
answer.

:class:`UnixGrpcServer` serves a service from its protobuf descriptor
(``pb2.DESCRIPTOR.services_by_name[...]``): each servicer method is a
coroutine ``(request, context)`` returning the response, or an async
generator of the responses of a stream; ``context`` is the call's
:class:`~plugin.servers.h2conn.H2Stream`, which our servicers do not use.
The plugin imports no ``grpc`` module at all (the generated ``*_pb2_grpc``
modules are for clients: tests, benches). ``stop(grace)`` behaves like
``grpc.aio.Server.stop``: calls that arrive from then on are refused with
UNAVAILABLE, calls in flight get ``grace`` seconds, then the rest are
cancelled with UNAVAILABLE and the connections closed. What the server
answers besides the servicers' own results, as grpc-go's server does:
UNIMPLEMENTED for a method not served, INTERNAL for a request that is not
one whole uncompressed message of the method's type, DEADLINE_EXCEEDED once
the caller's ``grpc-timeout`` has passed (the servicer is cancelled), and
UNKNOWN for a servicer that raised (logged here).

Concurrency model: everything runs on the process's asyncio loop; each call
is a task of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from plugin.servers import h2wire
from plugin.servers.h2conn import H2Connection, H2Stream
from plugin.servers.h2wire import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    UNAVAILABLE,
    UNIMPLEMENTED,
    UNKNOWN,
)

log = logging.getLogger(__name__)

_CLOSE_WAIT_S = 1.0  # how long stop() waits for cancelled calls to end
_PREFIX = struct.Struct(">BL")  # gRPC's message prefix: compressed flag, length


class _Method:
    __slots__ = ("func", "request", "streaming")

    def __init__(self, func: Callable[..., Any], request: Any, streaming: bool) -> None:
        self.func, self.request, self.streaming = func, request, streaming


class UnixGrpcServer:
    """Serves protobuf services (registered before :meth:`start`) on one socket."""

    def __init__(self) -> None:
        self._methods: dict[bytes, _Method] = {}
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[H2Connection] = set()
        self._calls: dict[asyncio.Task[None], tuple[H2Connection, H2Stream]] = {}
        self._timers: dict[asyncio.Task[None], asyncio.TimerHandle] = {}
        self._expired: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    def add_service(self, service: ServiceDescriptor, servicer: object) -> str:
        """Serve every method of ``service`` with the servicer's method of the
        same name; returns the service's full name."""
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            if method.client_streaming:
                raise ValueError(f"{path}: request streams are not served")
            func = getattr(servicer, method.name, None)
            if func is None:
                raise ValueError(f"{path}: {type(servicer).__name__} has no {method.name}")
            request = GetMessageClass(method.input_type)
            self._methods[path.encode()] = _Method(func, request, method.server_streaming)
        return str(service.full_name)

    @property
    def methods(self) -> list[str]:
        """The full method names served, e.g. ``/v1.DRAResourceHealth/NodeWatchResources``."""
        return sorted(m.decode() for m in self._methods)

    async def start(self, path: Path) -> None:
        """Listen on the Unix socket ``path`` (which must not exist)."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        # Kept: asyncio's loop lookups read the process id (a syscall) on 3.11.
        self._loop = loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._connection, str(path))

    def _connection(self) -> H2Connection:
        self._conns = {c for c in self._conns if not c.closed}
        conn = H2Connection(self._request)
        self._conns.add(conn)
        return conn

    def _request(self, conn: H2Connection, stream: H2Stream) -> None:
        """A whole request arrived: refuse it at once, or start its call."""
        method = self._methods.get(stream.headers.get(b":path", b""))
        timeout = stream.headers.get(b"grpc-timeout")
        seconds = None if timeout is None else h2wire.grpc_timeout_s(timeout)
        refusal = self._refusal(stream, method, seconds)
        if refusal is not None:
            conn.end(stream, h2wire.status_trailers(*refusal))
            return
        assert method is not None and self._loop is not None  # named by _refusal; start()
        task = self._loop.create_task(self._call(conn, stream, method))
        stream.task = task
        self._calls[task] = conn, stream
        self._idle.clear()
        task.add_done_callback(self._call_done)
        if seconds is not None:
            self._timers[task] = self._loop.call_later(seconds, self._expire, task)

    def _expire(self, task: asyncio.Task[None]) -> None:
        self._expired.add(task)
        task.cancel()

    def _refusal(
        self, stream: H2Stream, method: _Method | None, seconds: float | None
    ) -> tuple[int, str] | None:
        headers = stream.headers
        if self._closing:
            return UNAVAILABLE, "the server is shutting down"
        if headers.get(b":method") != b"POST" or not headers.get(b"content-type", b"").startswith(
            b"application/grpc"
        ):
            return INTERNAL, "not a gRPC request (POST, content-type application/grpc)"
        if method is None:
            path = headers.get(b":path", b"").decode(errors="replace")
            return UNIMPLEMENTED, f"unknown method {path}"
        if seconds == 0:
            return DEADLINE_EXCEEDED, "deadline exceeded before the call started"
        return _message_error(stream.body)

    def _call_done(self, task: asyncio.Task[None]) -> None:
        conn, stream = self._calls.pop(task)
        if task.cancelled():  # cancelled before it ran: answer for it
            self._cancelled(conn, stream)
        self._expired.discard(task)
        timer = self._timers.pop(task, None)
        if timer is not None:
            timer.cancel()
        if not self._calls:
            self._idle.set()

    async def _call(self, conn: H2Connection, stream: H2Stream, method: _Method) -> None:
        try:
            await self._serve(conn, stream, method)
        except asyncio.CancelledError:
            self._cancelled(conn, stream)
        except ConnectionResetError:
            pass  # the connection closed under a streaming answer
        except Exception:
            log.exception("gRPC method %s failed", stream.headers.get(b":path", b"").decode())
            conn.end(stream, h2wire.status_trailers(UNKNOWN, "Internal Server Error"))

    def _cancelled(self, conn: H2Connection, stream: H2Stream) -> None:
        """Answer a call whose task was cancelled: by stop(), or at its deadline."""
        if self._closing:
            conn.end(stream, h2wire.status_trailers(UNAVAILABLE, "the server stopped"))
        elif stream.task in self._expired:
            conn.end(stream, h2wire.status_trailers(DEADLINE_EXCEEDED, "deadline exceeded"))
        # else the client reset the stream or went away: nobody to answer

    async def _serve(self, conn: H2Connection, stream: H2Stream, method: _Method) -> None:
        try:
            request = method.request.FromString(bytes(memoryview(stream.body)[5:]))
        except DecodeError as exc:
            conn.end(stream, h2wire.status_trailers(INTERNAL, f"malformed request: {exc}"))
            return
        stream.body = bytearray()
        if not method.streaming:
            reply = await method.func(request, stream)
            await conn.send_message(stream, _framed(reply), h2wire.OK_TRAILERS)
            return
        async with contextlib.aclosing(method.func(request, stream)) as replies:
            async for reply in replies:
                await conn.send_message(stream, _framed(reply), None)
        conn.end(stream, h2wire.OK_TRAILERS)

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give those in flight ``grace`` seconds (None:
        none), cancel what is left and close the listener and connections."""
        self._closing = True
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        if grace and self._calls:
            try:
                async with asyncio.timeout(grace):
                    await self._idle.wait()
            except TimeoutError:
                log.warning("%d call(s) left after %.1fs; cancelling", len(self._calls), grace)
        for task in list(self._calls):
            task.cancel()  # each answers UNAVAILABLE
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_WAIT_S):
                await self._idle.wait()
        for conn in self._conns:
            conn.goaway()  # closes each connection once its streams end
        self._conns.clear()


def _message_error(body: bytearray) -> tuple[int, str] | None:
    """Why ``body`` is not one whole uncompressed gRPC message, or None."""
    if len(body) < 5:
        return INTERNAL, "the request carries no message"
    compressed, length = _PREFIX.unpack_from(body)
    if compressed:
        return UNIMPLEMENTED, "compressed messages are not served"
    if length != len(body) - 5:
        return INTERNAL, f"the request is not one message ({len(body) - 5} bytes, prefix {length})"
    return None


def _framed(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return _PREFIX.pack(0, len(data)) + data
