"""The plugin's gRPC server (``plugin.servers.unix_server``): services served
from their descriptors over a real Unix socket, a graceful stop, and no
thread at rest (issue 26: grpc-core's threads woke an idle plugin 6-10 times
a second)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from plugin.proto import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from plugin.servers.unix_server import UnixGrpcServer

REGISTRATION = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
HEALTH = health_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]


class Registration:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.entered = asyncio.Event()

    async def GetInfo(self, request: Any, context: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return registration_pb2.PluginInfo(type="DRAPlugin", name="test")

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return registration_pb2.RegistrationStatusResponse()


class Health:
    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for name in ("gpu-0", "gpu-1"):
            device = health_v1_pb2.DeviceIdentifier(pool_name="node-1", device_name=name)
            yield health_v1_pb2.NodeWatchResourcesResponse(
                devices=[health_v1_pb2.DeviceHealth(device=device, health=health_v1_pb2.HEALTHY)]
            )


async def test_serves_unary_and_stream_methods_from_descriptors(tmp_path: Path) -> None:
    server = UnixGrpcServer()
    assert server.add_service(REGISTRATION, Registration()) == "pluginregistration.Registration"
    server.add_service(HEALTH, Health())
    assert server.methods == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "/v1.DRAResourceHealth/NodeWatchResources",
    ]
    sock = tmp_path / "s.sock"
    await server.start(sock)
    try:
        async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
            info = await registration_pb2_grpc.RegistrationStub(ch).GetInfo(
                registration_pb2.InfoRequest(), timeout=5
            )
            assert (info.type, info.name) == ("DRAPlugin", "test")
            stream = health_v1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                health_v1_pb2.NodeWatchResourcesRequest(), timeout=5
            )
            names = [m.devices[0].device.device_name async for m in stream]
            assert names == ["gpu-0", "gpu-1"]
            assert await stream.code() == grpc.StatusCode.OK
    finally:
        await server.stop(None)


def test_a_servicer_without_a_method_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"/pluginregistration.Registration/GetInfo: .*GetInfo"):
        UnixGrpcServer().add_service(REGISTRATION, object())


@contextlib.asynccontextmanager
async def a_call_in_flight(
    tmp_path: Path,
) -> AsyncIterator[tuple[UnixGrpcServer, Registration, Any, asyncio.Future[Any]]]:
    """A server whose GetInfo call is in its servicer, held until ``release``."""
    servicer = Registration()
    servicer.release.clear()
    server = UnixGrpcServer()
    server.add_service(REGISTRATION, servicer)
    sock = tmp_path / "s.sock"
    await server.start(sock)
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        stub = registration_pb2_grpc.RegistrationStub(ch)
        call = asyncio.ensure_future(stub.GetInfo(registration_pb2.InfoRequest(), timeout=10))
        async with asyncio.timeout(5):
            await servicer.entered.wait()
        yield server, servicer, stub, call


async def test_stop_refuses_new_calls_and_lets_inflight_ones_finish(tmp_path: Path) -> None:
    async with a_call_in_flight(tmp_path) as (server, servicer, stub, inflight):
        stopping = asyncio.ensure_future(server.stop(10))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.NotifyRegistrationStatus(registration_pb2.RegistrationStatus(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not stopping.done() and not inflight.done()
        servicer.release.set()
        assert (await inflight).type == "DRAPlugin"
        async with asyncio.timeout(5):
            await stopping


async def test_stop_cancels_what_outlives_the_grace(tmp_path: Path) -> None:
    # release is never set: the call outlives any grace
    async with a_call_in_flight(tmp_path) as (server, _, _, call):
        async with asyncio.timeout(5):
            await server.stop(0.05)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


# Started in a process of its own: grpc-core threads that this test process
# may already run (its clients) must not count.
_AT_REST = textwrap.dedent(
    """
    import asyncio, os, tempfile
    from pathlib import Path
    from plugin.grpc_server import PluginServers
    from plugin.sockets import socket_paths

    class Handler:
        async def read(self, claims): return {}
        async def prepare(self, claims, fetched=None): return {}
        async def unprepare(self, claims): return {}

    class Health:
        async def updates(self):
            await asyncio.Event().wait()
            yield []

    async def main():
        with tempfile.TemporaryDirectory(dir="/tmp", prefix="pb-rest-") as tmp:
            top = Path(tmp)
            servers = PluginServers(socket_paths(top / "reg", top / "plug"), Handler(), Health())
            await servers.start()
            print(len(os.listdir("/proc/self/task")), flush=True)
            await servers.stop(0)

    asyncio.run(main())
    """
)


def test_the_plugin_servers_at_rest_run_no_thread() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _AT_REST], capture_output=True, text=True, check=True, timeout=60
    )
    # grpc.aio servers ran 7 more: 4 EventEngine workers, their lifeguard,
    # the timer thread and the completion-queue poller.
    assert out.stdout.split() == ["1"], out.stderr
