"""A gRPC server on one Unix socket that costs nothing while no call comes.

Why this module exists: grpc-core (``grpc.aio``) keeps timers and worker
threads running in every process that has a server, whether or not a call
ever comes: its EventEngine's timer list and the legacy iomgr timer thread
each wake once a second (their window is capped at 1 s), the thread pool's
lifeguard once a second, and each of its workers (``clamp(cores, 4, 16)``:
16 on a GPU node) every 3 s or sooner. That is 6-7 wake-ups/s and 0.03 % of
a core on our 2-core machine, 9-10 wake-ups/s and 0.04 % where grpc-core
sees 16 or more cores: with the plugin's own 0.017 %, over an idle plugin's
0.05 % budget (issue 26, docs/figures.md);
no setting of grpcio 1.85 (``GRPC_EXPERIMENTS``, poll strategy, channelz,
one server for both sockets) moves it. grpclib serves gRPC's HTTP/2 wire
protocol from the asyncio loop itself: no thread, no timer, nothing runs
between calls.

:class:`UnixGrpcServer` serves a service from its protobuf descriptor
(``pb2.DESCRIPTOR.services_by_name[...]``): each servicer method is a
coroutine ``(request, context)`` returning the response, or an async
generator of the responses of a stream; ``context`` is the grpclib stream,
which our servicers do not use. The plugin imports no ``grpc`` module at all
(the generated ``*_pb2_grpc`` modules are for clients: tests, benches), which
also saves 8.6 MB of resident memory against grpclib's 1.8 MB. ``stop(grace)``
behaves like ``grpc.aio.Server.stop``: calls that arrive from then on are
refused with UNAVAILABLE, calls in flight get ``grace`` seconds, then the rest
are cancelled and the listener closed. A method that is not served is answered
with UNIMPLEMENTED in grpclib's way, without a content-type, which grpc-go
reports as UNKNOWN; the kubelet calls only the services we register with.

Concurrency model: everything runs on the process's asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

log = logging.getLogger(__name__)

_CLOSE_WAIT_S = 1.0  # how long stop() waits for cancelled calls to end


class UnixGrpcServer:
    """Serves protobuf services (registered before :meth:`start`) on one socket."""

    def __init__(self) -> None:
        self._mapping: dict[str, Handler] = {}
        self._server: Server | None = None
        self._inflight = 0
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
            if method.server_streaming:
                call, cardinality = self._unary_stream(func), Cardinality.UNARY_STREAM
            else:
                call, cardinality = self._unary_unary(func), Cardinality.UNARY_UNARY
            request, reply = GetMessageClass(method.input_type), GetMessageClass(method.output_type)
            self._mapping[path] = Handler(call, cardinality, request, reply)
        return str(service.full_name)

    @property
    def methods(self) -> list[str]:
        """The full method names served, e.g. ``/v1.DRAResourceHealth/NodeWatchResources``."""
        return sorted(self._mapping)

    def _unary_unary(self, method: Callable[[Any, Any], Any]) -> Callable[[Stream[Any, Any]], Any]:
        async def call(stream: Stream[Any, Any]) -> None:
            with self._tracked():
                request = await stream.recv_message()
                reply = await self._unless_stopped(method(request, stream))
                await stream.send_message(reply)

        return call

    def _unary_stream(self, method: Callable[[Any, Any], Any]) -> Callable[[Stream[Any, Any]], Any]:
        async def call(stream: Stream[Any, Any]) -> None:
            with self._tracked():
                request = await stream.recv_message()
                async with contextlib.aclosing(method(request, stream)) as replies:
                    while True:
                        try:
                            reply = await self._unless_stopped(anext(replies))
                        except StopAsyncIteration:
                            return
                        await stream.send_message(reply)

        return call

    async def _unless_stopped(self, step: Awaitable[Any]) -> Any:
        """Await the servicer; a call that :meth:`stop` cancels ends with
        UNAVAILABLE (grpclib would send the client nothing at all)."""
        try:
            return await step
        except asyncio.CancelledError:
            if not self._closing:
                raise  # the client went away or its deadline passed
            raise GRPCError(Status.UNAVAILABLE, "the server stopped") from None

    def _tracked(self) -> _InFlight:
        if self._closing:
            raise GRPCError(Status.UNAVAILABLE, "the server is shutting down")
        return _InFlight(self)

    async def start(self, path: Path) -> None:
        """Listen on the Unix socket ``path`` (which must not exist)."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        server = Server([_Mapping(self._mapping)])
        await server.start(path=str(path))
        self._server = server

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give those in flight ``grace`` seconds (None:
        none), cancel what is left and close the listener."""
        self._closing = True
        server, self._server = self._server, None
        if server is None:
            return
        if grace:
            try:
                async with asyncio.timeout(grace):
                    await self._idle.wait()
            except TimeoutError:
                log.warning("%d call(s) left after %.1fs; cancelling", self._inflight, grace)
        server.close()  # cancels what is left; open connections stay open
        # until the process ends. The cancelled calls end at once; the bound
        # is for Python 3.12+, whose asyncio (not uvloop) also waits here
        # for every connection to close, and the kubelet keeps its own open.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_WAIT_S):
                await server.wait_closed()


class _InFlight:
    """Counts one call as in flight while its handler runs."""

    def __init__(self, owner: UnixGrpcServer) -> None:
        self._owner = owner

    def __enter__(self) -> None:
        self._owner._inflight += 1
        self._owner._idle.clear()

    def __exit__(self, *exc: object) -> None:
        self._owner._inflight -= 1
        if not self._owner._inflight:
            self._owner._idle.set()


class _Mapping:
    """What grpclib's ``Server`` takes as one service: ``__mapping__``."""

    def __init__(self, mapping: Mapping[str, Handler]) -> None:
        self._m = dict(mapping)

    def __mapping__(self) -> dict[str, Handler]:
        return self._m
