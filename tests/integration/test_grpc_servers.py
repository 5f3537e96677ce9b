"""The plugin's gRPC servers over real Unix sockets, with this test playing
the kubelet: registration handshake, prepare/unprepare through both DRA
versions, the health stream, and a graceful SIGTERM shutdown."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.claims.model import ClaimRef, Fetched, PreparedDevice, PrepareResult
from driver.health.model import DeviceHealth, HealthStatus
from plugin.grpc_server import PluginServers
from plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from plugin.sockets import SocketPaths, socket_paths

pytestmark = pytest.mark.integration

GOOD = ClaimRef("default", "good", "11111111-0000-0000-0000-000000000001")
BAD = ClaimRef("default", "bad", "11111111-0000-0000-0000-000000000002")


class FakeHandler:
    """Prepares GOOD (one GPU, chosen through a subrequest), fails BAD."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.entered = asyncio.Event()

    async def read(self, claims: Sequence[ClaimRef]) -> Fetched:
        return {}

    async def prepare(
        self, claims: Sequence[ClaimRef], fetched: Fetched | None = None
    ) -> Mapping[str, PrepareResult]:
        self.calls.append(("prepare", [c.uid for c in claims]))
        self.entered.set()
        await self.release.wait()
        out = {}
        for c in claims:
            if c.name == "bad":
                out[c.uid] = PrepareResult(error="claim is not allocated")
            else:
                dev = PreparedDevice(
                    ("gpu/large",),
                    "node-1",
                    "gpu-0",
                    (f"k8s.patchbay.dev/claim={c.uid}-gpu-0",),
                    "s1",
                )
                out[c.uid] = PrepareResult(devices=(dev,))
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.calls.append(("unprepare", [c.uid for c in claims]))
        return {c.uid: ("busy" if c.name == "bad" else "") for c in claims}


class QueueHealth:
    """A HealthSource fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[DeviceHealth]] = asyncio.Queue()

    async def updates(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        while True:
            yield await self.queue.get()


@pytest.fixture
def paths() -> Iterator[SocketPaths]:
    top = Path(tempfile.mkdtemp(dir="/tmp", prefix="pb-"))
    yield socket_paths(top / "reg", top / "plug")
    for p in sorted(top.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    top.rmdir()


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.02)


def _claims(pb2: Any, *claims: ClaimRef) -> list[Any]:
    return [pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


async def test_registration_handshake(paths: SocketPaths, caplog: pytest.LogCaptureFixture) -> None:
    servers = PluginServers(paths, FakeHandler(), QueueHealth())
    await servers.start()
    try:
        assert paths.registration.is_socket() and paths.dra.is_socket()
        async with grpc.aio.insecure_channel(f"unix://{paths.registration}") as ch:
            stub = registration_pb2_grpc.RegistrationStub(ch)
            info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=1)
            assert info.type == "DRAPlugin"
            assert info.name == "patchbay.dev"
            assert info.endpoint == str(paths.dra) and Path(info.endpoint).is_absolute()
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            assert not servers.registration.notified.is_set()
            await stub.NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=True), timeout=1
            )
            await asyncio.wait_for(servers.registration.registered.wait(), 1)
            with caplog.at_level(logging.ERROR):
                await stub.NotifyRegistrationStatus(
                    registration_pb2.RegistrationStatus(plugin_registered=False, error="no"),
                    timeout=1,
                )
            status = servers.registration.status
            assert status is not None and not status.registered and status.error == "no"
            assert not servers.registration.registered.is_set()
            assert "refused to register" in caplog.text
    finally:
        await servers.stop()
    assert not paths.registration.exists() and not paths.dra.exists()


async def test_no_health_version_without_source(paths: SocketPaths) -> None:
    servers = PluginServers(paths, FakeHandler())
    await servers.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{paths.registration}") as ch:
            info = await registration_pb2_grpc.RegistrationStub(ch).GetInfo(
                registration_pb2.InfoRequest(), timeout=1
            )
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    finally:
        await servers.stop()


@pytest.mark.parametrize(
    "pb2,pb2_grpc", [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]
)
async def test_prepare_unprepare_one_bad_claim(paths: SocketPaths, pb2: Any, pb2_grpc: Any) -> None:
    handler = FakeHandler()
    servers = PluginServers(paths, handler)
    await servers.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{paths.dra}") as ch:
            stub = pb2_grpc.DRAPluginStub(ch)
            resp = await stub.NodePrepareResources(
                pb2.NodePrepareResourcesRequest(claims=_claims(pb2, GOOD, BAD)), timeout=5
            )
            assert set(resp.claims) == {GOOD.uid, BAD.uid}
            good, bad = resp.claims[GOOD.uid], resp.claims[BAD.uid]
            assert good.error == ""
            (dev,) = good.devices
            assert list(dev.request_names) == ["gpu"]
            assert (dev.pool_name, dev.device_name) == ("node-1", "gpu-0")
            assert list(dev.cdi_device_ids) == [f"k8s.patchbay.dev/claim={GOOD.uid}-gpu-0"]
            if pb2 is dra_v1_pb2:
                assert dev.HasField("share_id") and dev.share_id == "s1"
            else:
                assert "share_id" not in dev.DESCRIPTOR.fields_by_name
            assert bad.error == "claim is not allocated" and len(bad.devices) == 0

            uresp = await stub.NodeUnprepareResources(
                pb2.NodeUnprepareResourcesRequest(claims=_claims(pb2, GOOD, BAD)), timeout=5
            )
            assert {k: v.error for k, v in uresp.claims.items()} == {GOOD.uid: "", BAD.uid: "busy"}
        assert handler.calls == [
            ("prepare", [GOOD.uid, BAD.uid]),
            ("unprepare", [GOOD.uid, BAD.uid]),
        ]
    finally:
        await servers.stop()


@pytest.mark.parametrize(
    ("pb2", "pb2_grpc", "version"),
    [
        (health_v1_pb2, health_v1_pb2_grpc, "v1.DRAResourceHealth"),
        (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc, "v1alpha1.DRAResourceHealth"),
    ],
    ids=["v1", "v1alpha1"],
)
async def test_health_stream_delivers_updates(
    paths: SocketPaths, caplog: pytest.LogCaptureFixture, pb2: Any, pb2_grpc: Any, version: str
) -> None:
    """Each health version is its own gRPC service on the DRA socket, fed by
    the one implementation, and the stream's opening names its version."""
    source = QueueHealth()
    servers = PluginServers(paths, FakeHandler(), source)
    await servers.start()
    first = [DeviceHealth("node-1", "gpu-0", HealthStatus.HEALTHY, 100)]
    second = [DeviceHealth("node-1", "gpu-0", HealthStatus.UNHEALTHY, 200, 30, "XID 79")]
    try:
        async with grpc.aio.insecure_channel(f"unix://{paths.dra}") as ch:
            stub = pb2_grpc.DRAResourceHealthStub(ch)
            with caplog.at_level(logging.INFO, logger="plugin.servers.health"):
                call = stub.NodeWatchResources(pb2.NodeWatchResourcesRequest())
                source.queue.put_nowait(first)
                msg = await asyncio.wait_for(call.read(), 5)
            assert f"kubelet opened a health stream ({version})" in caplog.text
            assert msg.devices[0].health == pb2.HEALTHY
            source.queue.put_nowait(first)  # unchanged: not re-sent
            source.queue.put_nowait(second)
            msg = await asyncio.wait_for(call.read(), 5)
            (d,) = msg.devices
            assert d.health == pb2.UNHEALTHY
            assert (d.device.device_name, d.last_updated_time, d.message) == (
                "gpu-0",
                200,
                "XID 79",
            )
            assert d.health_check_timeout_seconds == 30
            call.cancel()
    finally:
        await servers.stop()


async def test_sigterm_finishes_inflight_call_and_removes_sockets(paths: SocketPaths) -> None:
    handler = FakeHandler()
    handler.release.clear()
    source = QueueHealth()
    servers = PluginServers(paths, handler, source, grace_s=8)
    run = asyncio.create_task(servers.run())
    await _until(paths.registration.exists)

    async with grpc.aio.insecure_channel(f"unix://{paths.dra}") as ch:
        health = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_v1alpha1_pb2.NodeWatchResourcesRequest()
        )
        source.queue.put_nowait([DeviceHealth("node-1", "gpu-0", HealthStatus.HEALTHY, 1)])
        await asyncio.wait_for(health.read(), 5)
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        inflight = asyncio.ensure_future(
            stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=_claims(dra_v1_pb2, GOOD)), timeout=10
            )
        )
        await asyncio.wait_for(handler.entered.wait(), 5)
        os.kill(os.getpid(), signal.SIGTERM)
        await _until(lambda: not paths.registration.exists())
        # The open health stream is ended by the server (not waited on for the
        # grace period) while the in-flight prepare still holds the server up.
        assert await asyncio.wait_for(health.read(), 5) is grpc.aio.EOF
        assert await health.code() == grpc.StatusCode.OK
        assert not run.done() and not inflight.done(), "stopped before the in-flight call finished"
        handler.release.set()
        resp = await asyncio.wait_for(inflight, 5)
        assert resp.claims[GOOD.uid].error == ""
        assert resp.claims[GOOD.uid].devices[0].device_name == "gpu-0"
        await asyncio.wait_for(run, 5)
    assert not paths.dra.exists() and not paths.registration.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
