"""The real ``patchbay-fabric`` process on a loopback port, with a temp SQLite
file and simulated hosts: host-side effects, latency, failure injection,
SIGKILL mid-task and restart, racing attaches. No Kubernetes needed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

import aiohttp
import pytest

from driver.fabricclient import FabricClient, FabricConflict
from driver.pci.uevents import UeventFeed
from fabric.service.demo import write_demo
from fabric.simhost.host import SimHost

pytestmark = pytest.mark.integration
TOKEN = "integration-token"


class Service:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.topology = write_demo(root)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, attach_latency: float = 0.05) -> None:
        port_file = self.root / "port"
        port_file.unlink(missing_ok=True)
        # Plain HTTP, explicitly: this file tests the service's behaviour; TLS
        # has its own tests (test_fabric_tls.py).
        env = dict(os.environ, FABRIC_TOKEN=TOKEN, FABRIC_INSECURE="true")
        with open(self.root / "service.log", "ab") as log:
            self.proc = self._spawn(env, port_file, attach_latency, log)
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert self.proc.poll() is None, (self.root / "service.log").read_text()
            assert time.monotonic() < deadline, "fabric service did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    def _spawn(
        self, env: dict[str, str], port_file: Path, attach_latency: float, log: IO[bytes]
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "fabric.service.main", "--fabric-topology", str(self.topology),
             "--fabric-db", str(self.root / "fabric.db"), "--fabric-port", "0",
             "--port-file", str(port_file), "--attach-latency", str(attach_latency),
             "--detach-latency", "0.05"],
            env=env, stderr=log,
        )  # fmt: skip

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def host(self, node: str) -> SimHost:
        return SimHost.open(self.root / node)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path)
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
async def client(service: Service) -> AsyncIterator[FabricClient]:
    c = FabricClient(service.url, TOKEN)
    yield c
    await c.close()


async def faults(service: Service, body: dict[str, object]) -> None:
    async with aiohttp.ClientSession() as s, s.post(
        f"{service.url}/patchbay/v1/faults", json=body,
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as r:  # fmt: skip
        assert r.status == 200, await r.text()


async def test_attach_appears_on_node_and_detach_reverses(
    service: Service, client: FabricClient
) -> None:
    host = service.host("node-a")
    feed = UeventFeed(host.uevent_path, str(host.sysfs_root))
    feed.read_new()
    dev = await client.device("gpu-2")
    res = await client.attach("gpu-2", "node-a", "adapter1")
    assert res.task is not None
    assert (await client.wait(res.task.uri, timeout_s=10, interval_s=0.05)).state == "Completed"
    conn = (await client.device("gpu-2")).connection
    assert conn is not None and conn.state == "Attached"
    # Redfish names no host PCI address for a fabric-attached function: NVML's, by UUID.
    bdf = next(b for b, u in host.gpu_uuids().items() if u == dev.uuid)
    # Under adapter1's root complex (pci0000:85), with the fabric's UUID in NVML.
    link = str((host.sysfs_root / "bus/pci/devices" / bdf).readlink())
    assert "/devices/pci0000:85/" in link, link
    assert host.gpu_uuids() == {bdf: dev.uuid}
    events = feed.read_new()
    assert [(e.action, e.slot_name) for e in events] == [("add", bdf)]
    task = await client.detach("gpu-2")
    assert task is not None and (await client.wait(task.uri, 10, 0.05)).state == "Completed"
    assert not (host.sysfs_root / "bus/pci/devices" / bdf).exists()
    assert host.gpu_uuids() == {}
    assert [(e.action, e.slot_name) for e in feed.read_new()] == [("remove", bdf)]


async def test_nic_attach_brings_a_pf_without_vfs(service: Service, client: FabricClient) -> None:
    # As a real PF arrives: its VF count is the node's to set (the plugin does).
    res = await client.attach("nic-0", "node-b", "adapter0")
    assert res.task is not None and (await client.wait(res.task.uri, 10, 0.05)).state == "Completed"
    nic = await client.device("nic-0")
    assert nic.connection is not None
    pci = service.host("node-b").sysfs_root / "bus/pci/devices"  # the PF: by its MAC
    (pf,) = [a.parents[2] for a in pci.glob("*/net/*/address") if a.read_text().strip() == nic.mac]
    assert (pf / "sriov_totalvfs").read_text().strip() == "4"
    assert (pf / "sriov_numvfs").read_text().strip() == "0"
    assert list(pf.glob("virtfn*")) == []


async def until_running(client: FabricClient, uri: str) -> None:
    """Poll until the task is Running (New until the service starts on it);
    fail if it ended instead."""
    async with asyncio.timeout(10):
        while (state := (await client.task(uri)).state) != "Running":
            assert state == "New", f"task {uri} is {state}, never seen Running"
            await asyncio.sleep(0.05)


async def test_latency_honoured_and_injected_failure(
    service: Service, client: FabricClient
) -> None:
    await faults(service, {"attachLatencySeconds": 0.6, "failNextAttaches": 1})
    t0 = time.monotonic()
    res = await client.attach("gpu-0", "node-c", "adapter0")
    assert res.task is not None
    # While the latency runs the attach is in progress: task open, connection attaching.
    assert (await client.task(res.task.uri)).state in ("New", "Running")
    conn = (await client.device("gpu-0")).connection
    assert conn is not None and conn.state == "Attaching"
    task = await client.wait(res.task.uri, 10, 0.05)
    print(f"attach with 0.6 s latency ended after {time.monotonic() - t0:.2f}s")
    assert task.state == "Exception" and "injected failure" in task.messages[0]
    assert service.host("node-c").gpu_uuids() == {}


async def test_a_lowered_latency_releases_an_attach_in_progress(
    service: Service, client: FabricClient
) -> None:
    # How the e2e tests hold an attach while they look at it: a latency far
    # longer than any test, lowered once they are done.
    await faults(service, {"attachLatencySeconds": 3600})
    res = await client.attach("gpu-1", "node-c", "adapter0")
    assert res.task is not None
    # Running: the service started on it and sleeps the latency (it sets Running
    # just before); a latency it did not honour would have ended it already.
    await until_running(client, res.task.uri)
    conn = (await client.device("gpu-1")).connection
    assert conn is not None and conn.state == "Attaching"
    assert (await client.task(res.task.uri)).state == "Running"
    await faults(service, {"attachLatencySeconds": 0.05})
    assert (await client.wait(res.task.uri, 10, 0.05)).state == "Completed"
    conn = (await client.device("gpu-1")).connection
    assert conn is not None and conn.state == "Attached"


async def test_concurrent_attaches_one_wins(service: Service, client: FabricClient) -> None:
    results = await asyncio.gather(
        *(client.attach("gpu-1", n, "adapter0") for n in ("node-a", "node-b", "node-c")),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1 and sum(isinstance(r, FabricConflict) for r in results) == 2
    assert winners[0].task is not None
    assert (await client.wait(winners[0].task.uri, 10, 0.05)).state == "Completed"
    total = sum(len(service.host(n).gpu_uuids()) for n in ("node-a", "node-b", "node-c"))
    assert total == 1


async def test_sigkill_mid_task_converges_after_restart(service: Service) -> None:
    service.stop()
    service.start(attach_latency=30)  # the task will still be Running when killed
    async with FabricClient(service.url, TOKEN) as c:
        res = await c.attach("gpu-3", "node-b", "adapter1")
        assert res.task is not None
        await until_running(c, res.task.uri)
    service.kill()
    service.start(attach_latency=0.05)
    async with FabricClient(service.url, TOKEN) as c:
        task = await c.wait(res.task.uri, 10, 0.05)
        assert task.state == "Completed"
        conn = (await c.device("gpu-3")).connection
        assert conn is not None and conn.state == "Attached"
    service.stop()  # a clean restart loses nothing and adds nothing twice
    service.start()
    async with FabricClient(service.url, TOKEN) as c:
        again = await c.attach("gpu-3", "node-b", "adapter1")
        assert again.task is None
    host = service.host("node-b")
    assert len(host.gpu_uuids()) == 1
    adds = [e for e in UeventFeed(host.uevent_path).read_new() if e.action == "add"]
    assert len(adds) == 1
