"""Adapter room over Redfish: each host port's Virtual CXL Switch and its vPPBs.

The client reads an adapter's room where DMTF puts it (DMTF's public-cxl
mockup: one VCS of three vPPBs on the CPU's upstream port U1, shared by
its initiators I2 and I3; I1, which it lists on three ports, gets none),
and our simulator serves it for an upstream port whose topology gives
``vppbs``: the VCS names the host's endpoint and port, each attached
device binds a vPPB, and an attach through a VCS with none free is refused
(409 ResourceExhaustion), as a real manager would.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from driver.errors import FabricApiError
from driver.fabricclient import FabricClient
from fabric.service import inventory
from fabric.service.app import make_app
from fabric.service.core import Fabric
from fabric.service.demo import write_demo
from fabric.service.store import Store
from tests.unit.fabric_service import TOKEN
from tests.unit.fabric_standard_server import MockupServer, serving

VCS = "/redfish/v1/Fabrics/pcie0/Switches/sw0/VCSs/up0"  # node-a adapter0's virtual switch


async def test_the_dmtf_cxl_mockups_host_port_has_three_vppbs_shared_by_its_initiators() -> None:
    async with serving(MockupServer("public-cxl"), systems={"CXL-System": "node-a"}) as fc:
        inv = await fc.inventory()
    rooms = {a.adapter: (a.room, a.vcs) for a in inv.adapters}
    shared = (3, "/redfish/v1/Fabrics/CXL/Switches/CXL/VCSs/1")
    assert rooms["I2"] == rooms["I3"] == shared
    assert rooms["I1"] == (0, "")  # the mockup lists I1 on U1, U2 and U3: no one room


async def test_the_simulator_serves_the_room_binds_vppbs_and_refuses_past_it(
    tmp_path: Path,
) -> None:
    path = write_demo(tmp_path)
    spec = json.loads(path.read_text())
    spec["fabrics"][0]["switches"][0]["upstream"][0]["vppbs"] = 1  # node-a/adapter0
    path.write_text(json.dumps(spec))
    fab = Fabric(inventory.load(path), Store(tmp_path / "f.db"), (0.01, 0.01))
    await fab.start()
    server = TestServer(make_app(fab, TOKEN))
    await server.start_server()
    try:
        async with FabricClient(str(server.make_url("")), TOKEN) as fc:
            inv = await fc.inventory()
            rooms = {(a.node, a.adapter): (a.room, a.vcs) for a in inv.adapters}
            assert rooms[("node-a", "adapter0")] == (1, VCS)
            assert rooms[("node-b", "adapter0")] == (0, "")  # no VCS served: not limited
            await fc.attach("gpu-0", "node-a", "adapter0")
            with pytest.raises(FabricApiError) as refused:
                await fc.attach("gpu-1", "node-a", "adapter0")
            assert refused.value.status == 409 and "vPPB" in str(refused.value)
            await fc.attach("gpu-1", "node-b", "adapter0")  # another host's room
        async with (
            aiohttp.ClientSession() as s,
            s.get(
                str(server.make_url(f"{VCS}/VPPBs/1")),
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as r,
        ):
            bridge = await r.json()
        assert bridge["BindingStatus"] == "BoundPhysicalPort"
        assert bridge["Links"]["Endpoints"] == [
            {"@odata.id": "/redfish/v1/Fabrics/pcie0/Endpoints/gpu-0"}
        ]
    finally:
        await server.close()
        await fab.close()
