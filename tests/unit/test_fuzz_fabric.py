"""Fuzzed fabric API bodies through the real client (its HTTP call replaced
by the bodies): near-valid Redfish endpoints, connections and tasks with
fields dropped, retyped or added. The property: a parsed inventory or task,
or :class:`FabricUnavailable` naming the resource, never another exception;
an error status always becomes a :class:`FabricApiError`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from driver.errors import FabricApiError, FabricNotFound, FabricUnavailable
from driver.fabricclient.client import FabricClient
from driver.fabricclient.model import FabricInventory, FabricTask
from driver.fabricclient.transport import Response, api_error
from tests.fuzzing import FUZZ, json_values, mutated

ROOT = "/redfish/v1"
FAB = f"{ROOT}/Fabrics/fab1"
PORT = {"@odata.id": f"{FAB}/Switches/sw0/Ports/p0"}
SYSTEM = f"{ROOT}/Systems/node-a"
GPU = f"{ROOT}/Chassis/c/Processors/gpu-0"
INITIATOR: dict[str, Any] = {
    "@odata.id": f"{FAB}/Endpoints/ini-0",
    "Id": "ini-0",
    "ConnectedEntities": [
        {
            "EntityType": "RootComplex",
            "EntityRole": "Initiator",
            "EntityLink": {"@odata.id": SYSTEM},
        }
    ],
    "Links": {
        "ConnectedPorts": [PORT],
        "Ports": [{"@odata.id": f"{SYSTEM}/FabricAdapters/adapter-0/Ports/0"}],
    },
}
TARGET: dict[str, Any] = {
    "@odata.id": f"{FAB}/Endpoints/gpu-0",
    "Id": "gpu-0",
    "ConnectedEntities": [
        {
            "EntityType": "Processor",
            "EntityRole": "Target",
            "EntityLink": {"@odata.id": GPU},
            "EntityPciId": {"VendorId": "0x10de", "DeviceId": "0x2330"},
        }
    ],
    "Status": {"State": "Enabled", "Health": "OK"},
    "Links": {"ConnectedPorts": [PORT]},
}
TASK_URI = f"{ROOT}/TaskService/Tasks/t1"
CONNECTION: dict[str, Any] = {
    "@odata.id": f"{FAB}/Connections/c0",
    "Id": "c0",
    "Status": {"State": "Enabled"},
    "Links": {
        "InitiatorEndpoints": [{"@odata.id": f"{FAB}/Endpoints/ini-0"}],
        "TargetEndpoints": [{"@odata.id": f"{FAB}/Endpoints/gpu-0"}],
    },
}
TASK: dict[str, Any] = {
    "@odata.id": TASK_URI,
    "Id": "t1",
    "TaskState": "Completed",
    "Messages": [{"Message": "attached"}],
    "Payload": {
        "HttpOperation": "POST",
        "TargetUri": f"{FAB}/Connections",
        "JsonBody": json.dumps(
            {"Links": {"TargetEndpoints": [{"@odata.id": f"{FAB}/Endpoints/gpu-0"}]}}
        ),
    },
}
LINKED: dict[str, Any] = {
    ROOT: {"@odata.id": ROOT, "Fabrics": {"@odata.id": f"{ROOT}/Fabrics"}},
    f"{ROOT}/Fabrics": {"Members": [{"@odata.id": FAB}]},
    FAB: {
        "@odata.id": FAB,
        "Id": "fab1",
        "Endpoints": {"@odata.id": f"{FAB}/Endpoints"},
        "Connections": {"@odata.id": f"{FAB}/Connections"},
    },
    SYSTEM: {"@odata.id": SYSTEM, "Id": "node-a", "HostName": "node-a"},
    GPU: {"@odata.id": GPU, "ProcessorType": "GPU", "UUID": "1b2c3d4e-0000-0000-0000-000000000001"},
}


def client(bodies: dict[str, Any]) -> FabricClient:
    """A client whose HTTP exchange answers ``bodies[path]`` (200), else 404."""
    fc = FabricClient("http://fabric.invalid", "token")
    bodies = {**LINKED, **bodies}

    async def request(method: str, uri: str, body: Any = None, headers: Any = None) -> Response:
        path = uri.split("?", 1)[0].rstrip("/")  # the root is asked as /redfish/v1/
        if path not in bodies:
            raise FabricNotFound(404, "ResourceNotFound", path)
        return Response(200, {}, bodies[path])

    fc._transport.request = request  # type: ignore[method-assign]
    return fc


def inventory(endpoints: list[Any], connections: list[Any]) -> FabricInventory:
    return asyncio.run(
        client(
            {
                f"{FAB}/Endpoints": {"Members": endpoints},
                f"{FAB}/Connections": {"Members": connections},
            }
        ).inventory()
    )


def test_the_templates_parse() -> None:  # the fuzz starts from valid bodies
    inv = inventory([INITIATOR, TARGET], [CONNECTION])
    (device,) = inv.devices
    assert device.vendor_id == 0x10DE and device.connection is not None
    assert device.adapters[0].node == "node-a" and device.uuid.startswith("GPU-1b2c")
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
    error = api_error(status, body)
    assert isinstance(error, FabricApiError) and error.status == status
    assert isinstance(error.code, str) and isinstance(error.message, str)
