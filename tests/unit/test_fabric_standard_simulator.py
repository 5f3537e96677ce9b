"""The standard client against our simulator without its legacy fields, in both
attach dialects: a GPU, an NVMe drive and CXL memory (on a CXL fabric) each
attach with one request, show their identity on the host, and detach."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from driver.fabricclient import FabricClient
from driver.fabricclient.dialect import DialectName
from fabric.service import inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.demo import write_demo
from fabric.service.store import Store
from fabric.simhost.host import SimHost

TOKEN = "t0ken"


def _spec(path: Path) -> None:
    """The demo, with an NVMe drive in sw0's free slot and a CXL fabric on node-c."""
    spec = json.loads(path.read_text())
    sw0 = spec["fabrics"][0]["switches"][0]
    sw0["slots"] = [s for s in sw0["slots"] if s.get("device")]
    sw0["slots"].append({"port": "slot3", "device": {"kind": "nvme", "id": "nvme-0"}})
    up = {"port": "up0", "node": "node-c", "adapter": "adapter1", "hostDir": "node-c"}
    cxl = {"port": "slot0", "device": {"kind": "cxlmem", "id": "cxl-0"}}
    switch = {"id": "csw0", "upstream": [up], "slots": [cxl]}
    spec["fabrics"].append({"id": "cxl0", "type": "CXL", "switches": [switch]})
    path.write_text(json.dumps(spec))


class Env:
    def __init__(self, server: TestServer, root: Path) -> None:
        self.server, self.root = server, root

    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def audit(self) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.url() + "/patchbay/v1/audit", headers=headers) as r,
        ):
            return list((await r.json())["attachRequests"])


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    path = write_demo(tmp_path)
    _spec(path)
    fab = Fabric(inventory.load(path), Store(tmp_path / "f.db"), (0.02, 0.02))
    await fab.start()
    server = TestServer(make_app(fab, TOKEN))
    await server.start_server()
    yield Env(server, tmp_path)
    await server.close()
    await fab.close()


@pytest.mark.parametrize("dialect", ["connections", "zones"])
async def test_each_kind_attaches_once_and_detaches(env: Env, dialect: DialectName) -> None:
    async with FabricClient(env.url(), TOKEN, dialect=dialect) as fc:
        inv = await fc.inventory()
        assert {d.id: d.kind for d in inv.devices if d.id in ("gpu-0", "nvme-0", "cxl-0")} == {
            "gpu-0": "gpu", "nvme-0": "nvme", "cxl-0": "cxlmem",
        }  # fmt: skip
        for dev, node, adapter in [("gpu-0", "node-a", "adapter0"),
                                   ("nvme-0", "node-a", "adapter0"),
                                   ("cxl-0", "node-c", "adapter1")]:  # fmt: skip
            result = await fc.attach(dev, node, adapter, key="claim-1")
            if result.task is not None:
                assert (await fc.wait(result.task.uri, 10, 0.02)).state == "Completed"
            device = await fc.device(dev)
            conn = device.connection
            assert conn is not None and (conn.node, conn.adapter, conn.state) == (
                node, adapter, "Attached",
            )  # fmt: skip
            again = await fc.attach(dev, node, adapter, key="claim-1")  # attached: no request
            assert again.task is None
            if dev == "gpu-0":
                uuids = SimHost.open(env.root / node).gpu_uuids().values()
                assert device.identity in uuids
            detached = await fc.detach(dev)
            assert detached is not None
            assert (await fc.wait(detached.uri, 10, 0.02)).state == "Completed"
            assert (await fc.device(dev)).connection is None
    asked = [(a["target"], a["initiator"], a["dialect"]) for a in await env.audit()]
    assert asked == [
        ("gpu-0", "node-a/adapter0", dialect),
        ("nvme-0", "node-a/adapter0", dialect),
        ("cxl-0", "node-c/adapter1", dialect),
    ]


async def test_two_zone_attaches_to_one_host_port_at_once_both_succeed(env: Env) -> None:
    # One claim, two devices behind one adapter: both PATCHes are built on the
    # zone's same ETag, the second is refused with 412 and built anew.
    async with FabricClient(env.url(), TOKEN, dialect="zones") as fc:
        await fc.inventory()

        async def attach(dev: str) -> None:
            result = await fc.attach(dev, "node-a", "adapter0", key=f"claim-{dev}")
            if result.task is not None:
                assert (await fc.wait(result.task.uri, 10, 0.02)).state == "Completed"

        await asyncio.gather(attach("gpu-0"), attach("nvme-0"))
        for dev in ("gpu-0", "nvme-0"):
            conn = (await fc.device(dev)).connection
            assert conn is not None and (conn.node, conn.adapter) == ("node-a", "adapter0")
    asked = sorted(a["target"] for a in await env.audit())
    assert asked == ["gpu-0", "nvme-0"]  # a PATCH refused with 412 attached nothing
