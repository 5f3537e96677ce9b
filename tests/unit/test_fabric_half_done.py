"""A fabric task that fails half-way leaves nothing half-done (issue 33, defects 3 and 4).

The in-process fabric service driven by the real client, in both attach
dialects. The hot-add of a NIC breaks after it put the NIC on the host, and
the hot-remove that would undo it fails once too (as the simulated host's
``FileNotFoundError`` did in the CI run of issue 33): the attach task ends
in ``Exception`` and its connection is failed, never left attaching, and
the next request through that adapter is answered on its merits. A zone
member whose attach still runs reads as attaching, not attached.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from driver.fabricclient import FabricClient
from driver.fabricclient.dialect import DialectName
from fabric.service import hosts
from fabric.simhost.host import SimHost
from tests.unit.fabric_service import TOKEN, Env, break_the_next_attach, fabric_env

DIALECTS = ["connections", "zones"]
NIC, NODE, ADAPTER = "nic-0", "node-a", "adapter0"


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with fabric_env(tmp_path) as env:
        yield env


def client(env: Env, dialect: DialectName) -> FabricClient:
    return FabricClient(str(env.server.make_url("")), TOKEN, dialect=dialect)


def macs_on(env: Env, node: str) -> list[str]:
    pci = SimHost.open(env.root / node).sysfs_root / "bus/pci/devices"
    return [a.read_text().strip() for a in pci.glob("*/net/*/address")]


async def attach(fc: FabricClient, device: str = NIC, key: str = "claim") -> str:
    """Attach through node-a's adapter0; the state its task ended in."""
    result = await fc.attach(device, NODE, ADAPTER, key=key)
    if result.task is None:
        return "Completed"
    return (await fc.wait(result.task.uri, 10, 0.02)).state


async def connection_status(env: Env, device: str) -> dict[str, Any]:
    conn = (await env.client.device(device)).connection
    assert conn is not None
    status, body = await env.raw("GET", f"/redfish/v1/Fabrics/pcie0/Connections/{conn.id}")
    assert status == 200, body
    return dict(body["Status"])


@asynccontextmanager
async def broken_attach(
    env: Env, dialect: DialectName, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FabricClient, str]]:
    """The NIC's attach through a client of ``dialect``, broken half-way and
    its rollback too (:func:`break_the_next_attach`): it ended in
    ``Exception``. The client, and the NIC's MAC."""
    mac = (await env.client.device(NIC)).mac
    break_the_next_attach(monkeypatch)
    async with client(env, dialect) as fc:
        assert await attach(fc) == "Exception"
        yield fc, mac


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_attach_whose_rollback_fails_leaves_the_adapter_usable(
    env: Env, dialect: DialectName, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broken_attach(env, dialect, monkeypatch) as (fc, mac):
        # Failed, as the Redfish Connection says it: never left attaching.
        assert await connection_status(env, NIC) == {
            "State": "UnavailableOffline", "Health": "Critical",
        }  # fmt: skip
        task = (await env.fab.call(env.fab.store.tasks))[-1]
        assert "hot-add of nic-0 on node-a failed" in task.message
        assert "undoing it failed too" in task.message
        conn = (await fc.device(NIC)).connection
        assert conn is not None and conn.state == "Failed"
        # The next attach through the adapter clears what is left and attaches anew.
        assert await attach(fc, key="claim-2") == "Completed"
        conn = (await fc.device(NIC)).connection
        assert conn is not None and (conn.node, conn.adapter, conn.state) == (
            NODE, ADAPTER, "Attached",
        )  # fmt: skip
    assert await connection_status(env, NIC) == {"State": "Enabled", "Health": "OK"}
    assert macs_on(env, NODE).count(mac) == 1  # the NIC once, not twice


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_failed_connection_detaches_and_leaves_nothing_on_the_host(
    env: Env, dialect: DialectName, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broken_attach(env, dialect, monkeypatch) as (fc, mac):
        assert mac in macs_on(env, NODE)  # what the broken hot-add left
        task = await fc.detach(NIC)  # answered on its merits: not 409 "still attaching"
        assert task is not None
        assert (await fc.wait(task.uri, 10, 0.02)).state == "Completed"
        assert (await fc.device(NIC)).connection is None
    assert mac not in macs_on(env, NODE)


async def test_a_task_that_crashes_fails_its_connection(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*args: Any) -> Any:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(hosts, "add", crash)
    assert await attach(env.client, "gpu-0") == "Exception"
    assert await connection_status(env, "gpu-0") == {
        "State": "UnavailableOffline", "Health": "Critical",
    }  # fmt: skip
    monkeypatch.undo()
    assert await attach(env.client, "gpu-0", key="claim-2") == "Completed"


async def test_a_zone_member_still_attaching_is_not_attached(env: Env) -> None:
    await env.faults({"attachLatencySeconds": 3600})  # held until the latency is lowered
    async with client(env, "zones") as fc:
        result = await fc.attach("gpu-0", NODE, ADAPTER, key="claim")
        assert result.task is not None
        conn = (await fc.device("gpu-0")).connection
        assert conn is not None and (conn.node, conn.adapter) == (NODE, ADAPTER)
        assert conn.state == "Attaching"  # a member of the zone, but not done
        assert not (await fc.device("gpu-0")).in_use
        await env.faults({"attachLatencySeconds": 0})
        assert (await fc.wait(result.task.uri, 10, 0.02)).state == "Completed"
        conn = (await fc.device("gpu-0")).connection
        assert conn is not None and conn.state == "Attached"


async def test_a_failed_zone_member_is_failed_and_its_zone_says_so(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    break_the_next_attach(monkeypatch)
    async with client(env, "zones") as fc:
        assert await attach(fc) == "Exception"
        conn = (await fc.device(NIC)).connection
        assert conn is not None and conn.state == "Failed"
    status, zone = await env.raw("GET", conn.uri)  # the zone, in this dialect
    assert status == 200, zone
    members = [m["@odata.id"].rsplit("/", 1)[-1] for m in zone["Links"]["Endpoints"]]
    assert NIC in members and zone["Status"]["HealthRollup"] == "Critical"
