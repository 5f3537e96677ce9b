"""Valid Redfish bodies of a fabric manager (an initiator and a target
endpoint, a connection between them, the task that made it) and a fabric
client that a dict of bodies answers instead of HTTP.

Why: the fabric fuzz tests mutate these bodies and test_malformed_inputs.py
alters them by hand, one found bug a case; both read them here."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from driver.errors import FabricNotFound
from driver.fabricclient.client import FabricClient
from driver.fabricclient.model import FabricInventory
from driver.fabricclient.transport import Response

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
