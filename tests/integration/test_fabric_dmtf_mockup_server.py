"""The fabric client against DMTF's own Redfish-Mockup-Server serving mockups (issue 35).

DMTF's server (``../shared/redfish/mockup-server``, its packages in a venv of
its own: ``tests/harness/redfish_servers``) serves DMTF's public CXL mockup
and our two-switch mockup (``tests/unit/fabric_two_switch``); it keeps
POSTed members, PATCHes and DELETEs in memory, which is enough for both
attach dialects. Shown: inventory (the endpoint the collection omits, a
device in two Connections), attach and detach with Connections (read back
attached, then nothing attached), attach and detach by zone membership.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from driver.errors import FabricAttachConflict
from driver.fabricclient import FabricClient, FabricTask
from tests.harness.redfish_servers import MOCKUPS, mockup_server
from tests.unit.fabric_two_switch import CONNS, two_switch_tree, write_mockup

pytestmark = pytest.mark.integration
CXL_NODES = {"CXL-System": "node-a"}


async def done(fc: FabricClient, task: FabricTask | None) -> None:
    assert task is not None
    ended = await fc.wait(task.uri, timeout_s=60, interval_s=0.05)
    assert ended.state == "Completed", ended


async def zone(url: str, ident: str) -> list[dict[str, Any]]:
    uri = f"{url}/redfish/v1/Fabrics/CXL/Zones/{ident}"
    async with aiohttp.ClientSession() as s, s.get(uri) as r:
        body = await r.json(content_type=None)
    return list(body["Links"]["Endpoints"])


@pytest.fixture
def public_cxl(tmp_path: Path) -> Iterator[str]:
    with mockup_server(MOCKUPS / "public-cxl", tmp_path / "server.log") as url:
        yield url


@pytest.fixture
def two_switch(tmp_path: Path) -> Iterator[str]:
    folder = write_mockup(two_switch_tree(), tmp_path / "two-switch")
    with mockup_server(folder, tmp_path / "server.log") as url:
        yield url


async def test_public_cxl_inventory_finds_the_omitted_initiator(public_cxl: str) -> None:
    async with FabricClient(public_cxl, "unused", systems=CXL_NODES) as fc:
        inv = await fc.inventory()
    assert sorted(d.id for d in inv.devices) == ["T2", "T3", "T4", "T5"]
    # I4 is missing from the Endpoints collection; Connection 14 names it.
    assert sorted(a.endpoint for a in inv.adapters) == ["I1", "I2", "I3", "I4"]
    t4 = inv.device("T4").connection
    assert t4 is not None and (t4.node, t4.adapter, t4.state) == ("node-a", "I4", "Attached")
    assert inv.broken == () and inv.held_back == ()


async def test_public_cxl_connections_attach_reads_back_and_detach_leaves_nothing(
    public_cxl: str,
) -> None:
    async with FabricClient(public_cxl, "unused", systems=CXL_NODES) as fc:
        assert (await fc.device("T5")).connection is None
        result = await fc.attach("T5", "node-a", "I1")
        assert result.task is None and result.connection_uri.startswith(
            "/redfish/v1/Fabrics/CXL/Connections/"
        )
        t5 = await fc.device("T5")
        assert t5.connection is not None and (t5.connection.node, t5.connection.adapter) == (
            "node-a", "I1",
        )  # fmt: skip
        await done(fc, await fc.detach("T5"))
        assert (await fc.device("T5")).connections == ()


async def test_public_cxl_zones_attach_and_detach(public_cxl: str) -> None:
    async with FabricClient(public_cxl, "unused", systems=CXL_NODES, dialect="zones") as fc:
        # Zone 3 holds I3 with T3, T4, T5: by membership, T5 is attached to I3.
        t5 = await fc.device("T5")
        assert [(c.id, c.adapter) for c in t5.connections] == [("3", "I3")]
        with pytest.raises(FabricAttachConflict):  # not into I1's zone while in I3's
            await fc.attach("T5", "node-a", "I1")
        await done(fc, await fc.detach("T5"))
        result = await fc.attach("T5", "node-a", "I1")  # zone 1 (I1, T1) gains T5
        assert result.connection_uri == "/redfish/v1/Fabrics/CXL/Zones/1"
        t5 = await fc.device("T5")
        assert [(c.id, c.adapter) for c in t5.connections] == [("1", "I1")]
        await done(fc, await fc.detach("T5"))
        assert (await fc.device("T5")).connections == ()
        assert [m["@odata.id"].rsplit("/", 1)[1] for m in await zone(public_cxl, "3")] == [
            "I3", "T3", "T4", "1",
        ]  # fmt: skip


async def test_two_switch_device_in_two_connections_detached_whole(two_switch: str) -> None:
    async with FabricClient(two_switch, "unused") as fc:
        mem = await fc.device("mem-3")
        assert sorted(c.uri for c in mem.connections) == [f"{CONNS}/c1", f"{CONNS}/c2"]
        assert sorted(a.adapter for a in mem.adapters) == ["fa0", "fa1", "fa2"]
        await done(fc, await fc.detach("mem-3"))
        after = await fc.inventory()
    assert after.device("mem-3").connections == ()
    assert after.device("ld-2").connection is not None  # the other host's is left alone
