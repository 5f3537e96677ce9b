"""The simulated fabric's faults for issue 35's partial failures, read by the
real client in both dialects: ``brokenEndpoint`` (one Endpoint answers 500:
the client keeps the rest and holds back only that device, naming the URI)
and ``refuseAttach`` (the attach of one device is refused with 400: the
client's ``FabricAttachRefused`` names the request; other attaches go on).
The in-process service and client of tests/unit/fabric_service.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from driver.errors import FabricAttachRefused
from driver.fabricclient.dialect import DialectName
from tests.unit.fabric_service import Env, fabric_env

ENDPOINTS = "/redfish/v1/Fabrics/pcie0/Endpoints"


@pytest.fixture(params=["connections", "zones"])
async def env(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    dialect: DialectName = request.param
    async with fabric_env(tmp_path, dialect) as env:
        yield env


async def attached(env: Env, device: str) -> None:
    result = await env.client.attach(device, "node-a", "adapter0")
    assert result.task is not None
    assert (await env.client.wait(result.task.uri, 5, 0.02)).state == "Completed"


async def test_a_broken_endpoint_is_500_and_holds_back_only_its_device(env: Env) -> None:
    view = await env.faults({"devices": {"gpu-1": {"brokenEndpoint": True}}})
    assert view["devices"]["gpu-1"]["brokenEndpoint"] is True  # type: ignore[index]
    status, body = await env.raw("GET", f"{ENDPOINTS}/gpu-1")
    assert status == 500 and body["error"]["code"].endswith(".InternalError")
    status, body = await env.raw("GET", f"{ENDPOINTS}?$expand=.")
    (link,) = [m for m in body["Members"] if m["@odata.id"].endswith("/gpu-1")]
    assert link == {"@odata.id": f"{ENDPOINTS}/gpu-1"}  # not inlined: a reader meets the 500
    inv = await env.client.inventory()
    assert sorted(d.id for d in inv.devices) == ["gpu-0", "gpu-2", "gpu-3", "nic-0"]
    ((held, why),) = inv.held_back
    assert held == "gpu-1" and f"GET {ENDPOINTS}/gpu-1: HTTP 500" in why
    await attached(env, "gpu-0")  # the rest of the fabric works
    await env.faults({"devices": {"gpu-1": {"brokenEndpoint": False}}})
    inv = await env.client.inventory()
    assert "gpu-1" in {d.id for d in inv.devices} and inv.held_back == ()


async def test_a_refused_attach_is_400_naming_the_request(env: Env) -> None:
    await env.faults({"devices": {"gpu-0": {"refuseAttach": True}}})
    with pytest.raises(FabricAttachRefused) as refused:
        await env.client.attach("gpu-0", "node-a", "adapter0")
    print(refused.value)
    assert refused.value.status == 400 and refused.value.code == "ActionNotSupported"
    assert refused.value.method in ("POST", "PATCH") and refused.value.uri.startswith(
        "/redfish/v1/Fabrics/pcie0/"
    )
    assert "fault refuseAttach" in str(refused.value)
    assert (await env.client.device("gpu-0")).connection is None
    await attached(env, "gpu-1")  # other devices attach
    await env.faults({"devices": {"gpu-0": {"refuseAttach": False}}})
    await attached(env, "gpu-0")
