"""Fuzzed fabric API bodies through the real client (its HTTP call replaced
by the bodies): near-valid Redfish endpoints, connections and tasks with
fields dropped, retyped or added. The property: a parsed inventory or task,
or :class:`FabricUnavailable` naming the resource, never another exception;
an error status always becomes a :class:`FabricApiError`."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from driver.errors import FabricApiError, FabricUnavailable
from driver.fabricclient.client import FabricClient, _api_error
from driver.fabricclient.model import FabricInventory, FabricTask
from tests.fuzzing import FUZZ, json_values, mutated

FAB = "/redfish/v1/Fabrics/fab1"
PORT = {"@odata.id": f"{FAB}/Switches/sw0/Ports/p0"}
INITIATOR: dict[str, Any] = {
    "@odata.id": f"{FAB}/Endpoints/ini-0",
    "Id": "ini-0",
    "EntityRole": "Initiator",
    "Links": {"ConnectedPorts": [PORT]},
    "Oem": {"Patchbay": {"Node": "node-a", "Adapter": "adapter-0"}},
}
TARGET: dict[str, Any] = {
    "@odata.id": f"{FAB}/Endpoints/gpu-0",
    "Id": "gpu-0",
    "EntityRole": "Target",
    "ConnectedEntities": [
        {"EntityType": "Processor", "EntityPciId": {"VendorId": "0x10de", "DeviceId": "0x2330"}}
    ],
    "Status": {"State": "Enabled", "Health": "OK"},
    "Links": {"ConnectedPorts": [PORT]},
    "Oem": {
        "Patchbay": {
            "DeviceType": "GPU",
            "Model": "H100",
            "SerialNumber": "S1",
            "UUID": "GPU-1",
            "MACAddress": "",
            "InUse": False,
        }
    },
}
TASK_URI = "/redfish/v1/TaskService/Tasks/t1"
CONNECTION: dict[str, Any] = {
    "@odata.id": f"{FAB}/Connections/c0",
    "Id": "c0",
    "Links": {
        "InitiatorEndpoints": [{"@odata.id": f"{FAB}/Endpoints/ini-0"}],
        "TargetEndpoints": [{"@odata.id": f"{FAB}/Endpoints/gpu-0"}],
    },
    "Oem": {
        "Patchbay": {
            "State": "Attached",
            "PciBusId": "0000:18:00.0",
            "Task": {"@odata.id": TASK_URI},
        }
    },
}
TASK: dict[str, Any] = {
    "@odata.id": TASK_URI,
    "Id": "t1",
    "TaskState": "Completed",
    "Messages": [{"Message": "attached"}],
    "Oem": {
        "Patchbay": {
            "Operation": "attach",
            "Connection": {"@odata.id": f"{FAB}/Connections/c0"},
            "Target": {"@odata.id": f"{FAB}/Endpoints/gpu-0"},
        }
    },
}


def client(bodies: dict[str, dict[str, Any]]) -> FabricClient:
    """A client whose HTTP call answers ``bodies[uri]`` (200)."""
    fc = FabricClient("http://fabric.invalid", "token")

    async def request(
        method: str, uri: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        return 200, {}, bodies[uri.removesuffix("?$expand=.")]

    fc._request = request  # type: ignore[method-assign]
    return fc


def inventory(endpoints: list[Any], connections: list[Any]) -> FabricInventory:
    fc = client(
        {
            "/redfish/v1/Fabrics": {"Members": [{"Id": "fab1"}]},
            f"{FAB}/Endpoints": {"Members": endpoints},
            f"{FAB}/Connections": {"Members": connections},
        }
    )
    return asyncio.run(fc.inventory())


def test_the_templates_parse() -> None:  # the fuzz starts from valid bodies
    inv = inventory([INITIATOR, TARGET], [CONNECTION])
    (device,) = inv.devices
    assert device.vendor_id == 0x10DE and device.connection is not None
    assert device.adapters[0].node == "node-a"
    task = asyncio.run(client({TASK_URI: TASK}).task(TASK_URI))
    assert task.state == "Completed" and task.device == "gpu-0"


@FUZZ
@given(
    st.lists(st.one_of(mutated(INITIATOR), mutated(TARGET), json_values(3)), max_size=3),
    st.lists(st.one_of(mutated(CONNECTION), json_values(3)), max_size=2),
)
def test_inventory_bodies_parse_or_fail_as_unavailable(
    endpoints: list[Any], connections: list[Any]
) -> None:
    try:
        inv = inventory(endpoints, connections)
    except FabricUnavailable as exc:
        assert FAB in str(exc), exc
        return
    for device in inv.devices:
        assert isinstance(device.vendor_id, int) and isinstance(device.id, str)


@FUZZ
@given(mutated(TASK))
def test_task_bodies_parse_or_fail_as_unavailable(body: dict[str, Any]) -> None:
    try:
        task = asyncio.run(client({TASK_URI: body}).task(TASK_URI))
    except FabricUnavailable as exc:
        assert TASK_URI in str(exc), exc
        return
    assert isinstance(task, FabricTask) and all(isinstance(m, str) for m in task.messages)


@FUZZ
@given(st.integers(min_value=400, max_value=599), json_values())
def test_any_error_body_is_a_fabric_api_error(status: int, body: Any) -> None:
    error = _api_error(status, body)
    assert isinstance(error, FabricApiError) and error.status == status
    assert isinstance(error.code, str) and isinstance(error.message, str)
