"""A CXL multi-logical device in the simulated fabric (issue 35).

One memory device (one serial) with four logical devices: the service shows
it as CXL's Redfish model does (one PCIeDevice, ``MaxNumberLogicalDevices``,
its ``CXLLogicalDevices`` each with its GCXLID ``<serial>:<LD id>``, one
target endpoint per LD), the real client reads four devices with their own
identity, and each LD attaches on its own: two to one host through one
adapter, one to another host. A host shows each LD it holds as Linux does:
its own memdev and PCI function (BDF), the serial shared.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp.test_utils import TestServer

from driver.cxl.discovery import memories
from driver.fabricclient import FabricClient
from fabric.service import hardware, inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.store import Store
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.unit.fabric_service import TOKEN

SERIAL = 0x4C1D96FFFEDDD835
CHASSIS = "/redfish/v1/Chassis/cxl0-sw0"
LDS = [f"mld-0-ld{k}" for k in range(4)]


def topology(root: Path) -> Path:
    for node in ("node-a", "node-b"):
        SimHost.build(TOPOLOGIES["fabric-adapters"](), root / node, node)
    up = [
        {"port": f"up{i}", "node": n, "adapter": "adapter0", "hostDir": n}
        for i, n in enumerate(("node-a", "node-b"))
    ]
    mld = {"kind": "cxlmem", "id": "mld-0", "serial": SERIAL, "memoryMiB": 64 * 1024,
           "logicalDevices": 4}  # fmt: skip
    switch = {"id": "sw0", "upstream": up, "slots": [{"port": "s0", "device": mld}]}
    path = root / "fabric.json"
    path.write_text(json.dumps({"fabrics": [{"id": "cxl0", "type": "CXL", "switches": [switch]}]}))
    return path


@asynccontextmanager
async def client(root: Path) -> AsyncIterator[FabricClient]:
    fab = Fabric(inventory.load(topology(root)), Store(root / "f.db"), (0.01, 0.01))
    await fab.start()
    server = TestServer(make_app(fab, TOKEN))
    await server.start_server()
    try:
        async with FabricClient(str(server.make_url("")), TOKEN) as c:
            yield c
    finally:
        await server.close()
        await fab.close()


def test_the_service_shows_one_device_with_four_logical_devices(tmp_path: Path) -> None:
    inv = inventory.load(topology(tmp_path))
    assert sorted(t for t in inv.targets) == LDS
    tree = hardware.tree(inv)
    pcie = tree[f"{CHASSIS}/PCIeDevices/mld-0"]
    assert pcie["CXLDevice"]["MaxNumberLogicalDevices"] == 4
    assert f"{CHASSIS}/PCIeDevices/mld-0-ld1" not in tree  # one physical device
    members = tree[f"{CHASSIS}/PCIeDevices/mld-0/CXLLogicalDevices"]["Members"]
    assert [m["@odata.id"].rsplit("/", 1)[1] for m in members] == ["0", "1", "2", "3"]
    ld2 = tree[f"{CHASSIS}/PCIeDevices/mld-0/CXLLogicalDevices/2"]
    assert ld2["Identifiers"][0]["DurableName"] == "4C-1D-96-FF-FE-DD-D8-35:0002"
    assert ld2["MemorySizeMiB"] == 16 * 1024
    assert hardware.entity_link(inv.targets["mld-0-ld2"]) == ld2["@odata.id"]


async def test_each_ld_is_read_and_attached_on_its_own(tmp_path: Path) -> None:
    async with client(tmp_path) as c:
        devices = {d.id: d for d in (await c.inventory()).devices}
        assert sorted(devices) == LDS
        assert {d.serial for d in devices.values()} == {f"{SERIAL:#x}"}
        assert [devices[i].logical_device for i in LDS] == ["0000", "0001", "0002", "0003"]
        assert len({d.unique_identity for d in devices.values()}) == 4
        assert {d.capacity_bytes for d in devices.values()} == {16 << 30}
        for ld, node in (("mld-0-ld1", "node-a"), ("mld-0-ld2", "node-a"), ("mld-0-ld3", "node-b")):
            result = await c.attach(ld, node, "adapter0")
            if result.task is not None:
                assert (await c.wait(result.task.uri, 10)).state == "Completed"
        after = {d.id: d for d in (await c.inventory()).devices}
        held = {i: d.connection.node if d.connection else None for i, d in after.items()}
        assert held == dict(zip(LDS, (None, "node-a", "node-a", "node-b"), strict=True))
        on_a = memories(tmp_path / "node-a" / "sys")
        assert [m.serial for m in on_a] == [f"{SERIAL:#x}"] * 2
        assert len({m.bdf for m in on_a}) == 2 and len({m.memdev for m in on_a}) == 2
        assert {m.size for m in on_a} == {16 << 30}
        task = await c.detach("mld-0-ld1")
        assert task is not None and (await c.wait(task.uri, 10)).state == "Completed"
        assert len(memories(tmp_path / "node-a" / "sys")) == 1
        assert len(memories(tmp_path / "node-b" / "sys")) == 1
