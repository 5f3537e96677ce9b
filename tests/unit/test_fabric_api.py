"""The fabric service in-process (aiohttp test server) driven by the real client:
idempotency rules, the task state machine, fault injection, error bodies, auth."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from driver.fabricclient import FabricConflict
from fabric.simhost.host import SimHost
from tests.unit.fabric_service import TOKEN, Env, fabric_env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with fabric_env(tmp_path, latency=(0.05, 0.05)) as env:
        yield env


async def test_inventory_lists_devices_with_switch_and_reachable_adapters(env: Env) -> None:
    inv = await env.client.inventory()
    assert sorted(d.id for d in inv.devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "nic-0"]
    gpu2 = inv.device("gpu-2")
    assert gpu2.switch == "sw1" and gpu2.kind == "gpu" and gpu2.model == "H200-SXM5-141GB"
    assert sorted((a.node, a.adapter) for a in gpu2.adapters) == [
        ("node-a", "adapter1"),
        ("node-b", "adapter1"),
    ]
    assert len(inv.device("gpu-0").adapters) == 3
    assert gpu2.uuid.startswith("GPU-") and gpu2.vendor_id == 0x10DE and gpu2.health == "OK"
    nic = inv.device("nic-0")
    assert nic.kind == "nic" and nic.uuid == "" and nic.identity == nic.mac
    assert len(nic.mac.split(":")) == 6 and nic.mac.startswith("02:")


async def test_attached_nic_shows_the_fabric_mac_on_the_node(env: Env) -> None:
    nic = (await env.client.inventory()).device("nic-0")
    first = await env.client.attach("nic-0", "node-a", "adapter0")
    assert first.task is not None
    done = await env.client.wait(first.task.uri, timeout_s=5, interval_s=0.02)
    assert done.state == "Completed"
    conn = (await env.client.device("nic-0")).connection
    assert conn is not None and conn.state == "Attached"
    # Redfish names no host PCI address for a fabric-attached function: find the PF by MAC.
    pci = SimHost.open(env.root / "node-a").sysfs_root / "bus/pci/devices"
    macs = [a.read_text().strip() for a in pci.glob("*/net/*/address")]
    assert nic.mac in macs


async def test_attach_completes_and_is_idempotent_for_same_initiator(env: Env) -> None:
    # The task is held open (a latency lowered only once both asks are in), so the
    # second ask meets it however slow the machine is; 20 ms let it finish under load.
    await env.faults({"attachLatencySeconds": 3600})
    first = await env.client.attach("gpu-0", "node-a", "adapter0")
    assert first.task is not None and first.task.state == "New"
    again = await env.client.attach("gpu-0", "node-a", "adapter0")
    assert again.task is not None and again.task.uri == first.task.uri  # same open task
    await env.faults({"attachLatencySeconds": 0})
    done = await env.client.wait(first.task.uri, timeout_s=5, interval_s=0.02)
    assert done.state == "Completed" and done.messages == ()
    third = await env.client.attach("gpu-0", "node-a", "adapter0")
    assert third.task is None and third.connection_uri == first.connection_uri
    conn = (await env.client.device("gpu-0")).connection
    assert conn is not None and conn.state == "Attached" and conn.node == "node-a"
    gpu = await env.client.device("gpu-0")
    assert gpu.uuid in SimHost.open(env.root / "node-a").gpu_uuids().values()


async def test_event_stream_announces_attach_completion_and_faults(env: Env) -> None:
    stream = env.client.events()
    assert await anext(stream) == []  # subscribed
    seen: list[str] = []

    async def until(what: str) -> None:
        while not any(o.endswith(what) for o in seen):
            seen.extend(await asyncio.wait_for(anext(stream), 5))

    try:
        first = await env.client.attach("gpu-0", "node-a", "adapter0")
        assert first.task is not None
        await env.client.wait(first.task.uri, 5, 0.02)  # the handle is a task monitor
        assert first.connection_uri
        await until(first.connection_uri)  # the connection ended Starting
        await until("/Endpoints/gpu-0")
        seen.clear()
        await env.faults({"devices": {"nic-0": {"health": "Critical"}}})
        await until("/Endpoints/nic-0")
    finally:
        await stream.aclose()


async def test_attach_to_another_initiator_conflicts(env: Env) -> None:
    await env.client.attach("gpu-0", "node-a", "adapter0")
    with pytest.raises(FabricConflict) as exc:
        await env.client.attach("gpu-0", "node-b", "adapter0")
    assert exc.value.code == "ResourceInUse" and "node-a-adapter0" in exc.value.message


async def test_concurrent_attaches_of_one_device_one_wins(env: Env) -> None:
    results = await asyncio.gather(
        env.client.attach("gpu-1", "node-a", "adapter0"),
        env.client.attach("gpu-1", "node-b", "adapter0"),
        env.client.attach("gpu-1", "node-c", "adapter0"),
        return_exceptions=True,
    )
    conflicts = [r for r in results if isinstance(r, FabricConflict)]
    assert len(conflicts) == 2, results


async def test_injected_attach_failure_ends_in_exception_and_rolls_back(env: Env) -> None:
    await env.faults({"failNextAttaches": 1})
    res = await env.client.attach("gpu-2", "node-b", "adapter1")
    assert res.task is not None
    task = await env.client.wait(res.task.uri, timeout_s=5, interval_s=0.02)
    assert task.state == "Exception" and "injected failure" in task.messages[0]
    assert (await env.client.device("gpu-2")).connection is None
    assert SimHost.open(env.root / "node-b").gpu_uuids() == {}
    res2 = await env.client.attach("gpu-2", "node-b", "adapter1")  # counter used up
    assert res2.task is not None
    assert (await env.client.wait(res2.task.uri, 5, 0.02)).state == "Completed"


async def test_critical_device_fails_attach_and_reports_health(env: Env) -> None:
    await env.faults({"devices": {"gpu-3": {"health": "Critical"}}})
    assert (await env.client.device("gpu-3")).health == "Critical"
    res = await env.client.attach("gpu-3", "node-a", "adapter1")
    assert res.task is not None
    task = await env.client.wait(res.task.uri, 5, 0.02)
    assert task.failed and "critical" in task.messages[0]


async def test_detach_refused_in_use_then_reverses_attach(env: Env) -> None:
    res = await env.client.attach("gpu-0", "node-c", "adapter0")
    assert res.task is not None
    await env.client.wait(res.task.uri, 5, 0.02)
    await env.faults({"devices": {"gpu-0": {"inUse": True}}})
    with pytest.raises(FabricConflict, match="running work"):
        await env.client.detach("gpu-0")
    await env.faults({"devices": {"gpu-0": {"inUse": False}}, "failNextDetaches": 1})
    failed = await env.client.detach("gpu-0")
    assert failed is not None
    assert (await env.client.wait(failed.uri, 5, 0.02)).failed
    assert (await env.client.device("gpu-0")).connection is not None  # still attached
    task = await env.client.detach("gpu-0")
    assert task is not None and (await env.client.wait(task.uri, 5, 0.02)).state == "Completed"
    assert (await env.client.device("gpu-0")).connection is None
    assert SimHost.open(env.root / "node-c").gpu_uuids() == {}
    assert await env.client.detach("gpu-0") is None


async def test_device_lost_to_another_tenant_conflicts(env: Env) -> None:
    await env.faults({"devices": {"nic-0": {"foreignOwner": "tenant-x"}}})
    assert not (await env.client.device("nic-0")).available
    with pytest.raises(FabricConflict, match="another tenant"):
        await env.client.attach("nic-0", "node-a", "adapter0")


async def test_unreachable_pair_is_400(env: Env) -> None:
    f = "/redfish/v1/Fabrics/pcie0/Endpoints"
    body = {
        "Links": {
            "InitiatorEndpoints": [{"@odata.id": f"{f}/node-c-adapter0"}],
            "TargetEndpoints": [{"@odata.id": f"{f}/gpu-2"}],
        }
    }
    status, data = await env.raw("POST", "/redfish/v1/Fabrics/pcie0/Connections", json=body)
    assert status == 400 and data["error"]["code"] == "Base.1.18.ActionParameterValueConflict"


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b"{nope", "MalformedJSON", None),
        (b"[]", "MalformedJSON", None),
        (b"{}", "PropertyMissing", "Links"),
        (
            b'{"Links": {"InitiatorEndpoints": [], "TargetEndpoints": [{"@odata.id": "x"}]}}',
            "PropertyValueTypeError",
            "Links.InitiatorEndpoints",
        ),
        (
            b'{"Links": {"InitiatorEndpoints": [{"@odata.id": "/x"}],'
            b' "TargetEndpoints": [{"@odata.id": "/y"}]}}',
            "ResourceMissingAtURI",
            "Links.InitiatorEndpoints[0].@odata.id",
        ),
    ],
)
async def test_malformed_bodies_are_400_naming_the_field(
    env: Env, body: bytes, code: str, field: str | None
) -> None:
    status, data = await env.raw("POST", "/redfish/v1/Fabrics/pcie0/Connections", data=body)
    assert status == 400
    err = data["error"]
    assert err["code"] == f"Base.1.18.{code}"
    assert err["@Message.ExtendedInfo"][0]["MessageId"] == err["code"]
    if field:
        assert err["message"].startswith(field + ":")


async def test_auth_and_not_found_bodies(env: Env) -> None:
    status, data = await env.raw("GET", "/redfish/v1/Fabrics", token=None)
    assert status == 401 and data["error"]["code"] == "Base.1.18.NoValidSession"
    status, data = await env.raw("GET", "/redfish/v1/Fabrics", token="wrong")
    assert status == 401 and data["error"]["code"] == "Base.1.18.InsufficientPrivilege"
    status, _ = await env.raw("GET", "/redfish/v1", token=None)
    assert status == 200  # the service root is public
    # X-Auth-Token carries a session's token, never the service token itself.
    async with (
        aiohttp.ClientSession() as s,
        s.get(env.url("/redfish/v1/Fabrics"), headers={"X-Auth-Token": TOKEN}) as r,
    ):
        assert r.status == 401 and (await r.json())["error"]["message"].startswith("X-Auth-Token")
    status, data = await env.raw("GET", "/redfish/v1/Fabrics/nope/Endpoints")
    assert status == 404 and data["error"]["code"] == "Base.1.18.ResourceNotFound"
    status, data = await env.raw("DELETE", "/redfish/v1/Fabrics/pcie0/Connections/999")
    assert status == 404
    status, data = await env.raw("POST", "/patchbay/v1/faults", json={"devices": {"x": {}}})
    assert status == 400 and "devices.x" in data["error"]["message"]


async def test_redfish_shapes_of_fabric_ports_and_endpoints(env: Env) -> None:
    _, fab = await env.raw("GET", "/redfish/v1/Fabrics/pcie0")
    assert fab["FabricType"] == "PCIe"
    _, up = await env.raw("GET", "/redfish/v1/Fabrics/pcie0/Switches/sw0/Ports/up1")
    assert up["PortType"] == "UpstreamPort"
    assert up["Links"]["AssociatedEndpoints"][0]["@odata.id"].endswith("/node-b-adapter0")
    _, down = await env.raw("GET", "/redfish/v1/Fabrics/pcie0/Switches/sw0/Ports/slot3")
    assert down["PortType"] == "DownstreamPort" and down["Status"]["State"] == "Absent"
    _, ini = await env.raw("GET", "/redfish/v1/Fabrics/pcie0/Endpoints/node-b-adapter0")
    (entity,) = ini["ConnectedEntities"]
    assert entity["EntityRole"] == "Initiator" and "EntityRole" not in ini and "Oem" not in ini
    assert entity["EntityLink"]["@odata.id"] == "/redfish/v1/Systems/node-b"
    assert ini["Links"]["LocalPorts"] == [
        {"@odata.id": "/redfish/v1/Systems/node-b/FabricAdapters/adapter0/Ports/0"}
    ]
    assert "Ports" not in ini["Links"]
