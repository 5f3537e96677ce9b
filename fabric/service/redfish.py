"""Redfish resource shapes: URIs and the JSON of every resource we serve.

Pure functions from the inventory and store rows to JSON, following the DMTF
schemas (Fabric, Switch, Port, Endpoint, Connection, Task) so that a client
written against this simulator can later speak to a real fabric manager.
Values the schemas have no property for (node and adapter of an initiator,
device type, GPU UUID, the hot-added PCI address) sit under ``Oem.Patchbay``.
"""

from __future__ import annotations

import time
from typing import Any

from fabric.service.errors import message
from fabric.service.inventory import Initiator, Inventory, Target
from fabric.service.store import Connection, DeviceState, Task

ROOT = "/redfish/v1"
TASKS = f"{ROOT}/TaskService/Tasks"
Json = dict[str, Any]


def fabric_uri(fabric: str) -> str:
    return f"{ROOT}/Fabrics/{fabric}"


def switch_uri(fabric: str, switch: str) -> str:
    return f"{fabric_uri(fabric)}/Switches/{switch}"


def port_uri(fabric: str, switch: str, port: str) -> str:
    return f"{switch_uri(fabric, switch)}/Ports/{port}"


def endpoint_uri(fabric: str, endpoint: str) -> str:
    return f"{fabric_uri(fabric)}/Endpoints/{endpoint}"


def connection_uri(fabric: str, connection: int) -> str:
    return f"{fabric_uri(fabric)}/Connections/{connection}"


def task_uri(task: int) -> str:
    return f"{TASKS}/{task}"


def link(uri: str) -> Json:
    return {"@odata.id": uri}


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def collection(uri: str, kind: str, members: list[Json], expand: bool) -> Json:
    """A collection; ``expand`` inlines members (``$expand=.``) instead of links."""
    return {
        "@odata.id": uri,
        "@odata.type": f"#{kind}Collection.{kind}Collection",
        "Name": f"{kind} Collection",
        "Members@odata.count": len(members),
        "Members": members if expand else [link(m["@odata.id"]) for m in members],
    }


def service_root() -> Json:
    return {
        "@odata.id": ROOT,
        "@odata.type": "#ServiceRoot.v1_16_0.ServiceRoot",
        "Id": "RootService",
        "Name": "patchbay simulated fabric",
        "RedfishVersion": "1.18.0",
        "Fabrics": link(f"{ROOT}/Fabrics"),
        "TaskService": link(f"{ROOT}/TaskService"),
        "EventService": link(f"{ROOT}/EventService"),
    }


def fabric(inv: Inventory, ident: str) -> Json:
    uri = fabric_uri(ident)
    return {
        "@odata.id": uri,
        "@odata.type": "#Fabric.v1_3_2.Fabric",
        "Id": ident,
        "Name": f"{inv.fabrics[ident]} fabric {ident}",
        "FabricType": inv.fabrics[ident],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Switches": link(f"{uri}/Switches"),
        "Endpoints": link(f"{uri}/Endpoints"),
        "Connections": link(f"{uri}/Connections"),
    }


def switch(inv: Inventory, fab: str, ident: str) -> Json:
    uri = switch_uri(fab, ident)
    return {
        "@odata.id": uri,
        "@odata.type": "#Switch.v1_9_2.Switch",
        "Id": ident,
        "Name": f"switch {ident}",
        "SwitchType": inv.fabrics[fab],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Ports": link(f"{uri}/Ports"),
    }


def port(inv: Inventory, fab: str, sw: str, ident: str) -> Json:
    up = [i for i in inv.initiators.values() if (i.fabric, i.switch, i.port) == (fab, sw, ident)]
    down = [t for t in inv.targets.values() if (t.fabric, t.switch, t.port) == (fab, sw, ident)]
    ends = [endpoint_uri(fab, i.id) for i in up] + [endpoint_uri(fab, t.id) for t in down]
    return {
        "@odata.id": port_uri(fab, sw, ident),
        "@odata.type": "#Port.v1_9_0.Port",
        "Id": ident,
        "Name": f"port {ident}",
        "PortProtocol": inv.fabrics[fab],
        "PortType": "UpstreamPort" if up else "DownstreamPort",
        "Status": {"State": "Enabled" if ends else "Absent", "Health": "OK"},
        "Links": {"AssociatedEndpoints": [link(u) for u in ends]},
    }


def initiator(inv: Inventory, ini: Initiator) -> Json:
    return {
        "@odata.id": endpoint_uri(ini.fabric, ini.id),
        "@odata.type": "#Endpoint.v1_8_0.Endpoint",
        "Id": ini.id,
        "Name": f"{ini.node} adapter {ini.adapter}",
        "EntityRole": "Initiator",
        "EndpointProtocol": inv.fabrics[ini.fabric],
        "ConnectedEntities": [{"EntityType": "RootComplex", "EntityRole": "Initiator"}],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Links": {"ConnectedPorts": [link(port_uri(ini.fabric, ini.switch, ini.port))]},
        "Oem": {"Patchbay": {"Node": ini.node, "Adapter": ini.adapter, "Switch": ini.switch}},
    }


def target(inv: Inventory, tgt: Target, dev: DeviceState, conn: Connection | None) -> Json:
    pci = {"VendorId": f"0x{tgt.vendor_id:04x}", "DeviceId": f"0x{tgt.device_id:04x}"}
    oem: Json = {
        "DeviceType": tgt.kind.upper(),
        "Model": tgt.model,
        "SerialNumber": tgt.serial,
        "Switch": tgt.switch,
        "InUse": dev.in_use,
    }
    if tgt.uuid:
        oem["UUID"] = tgt.uuid
    if tgt.kind == "nic":
        oem["TotalVfs"] = tgt.total_vfs
        oem["MACAddress"] = tgt.mac
    links: Json = {"ConnectedPorts": [link(port_uri(tgt.fabric, tgt.switch, tgt.port))]}
    if conn is not None:
        links["Connections"] = [link(connection_uri(tgt.fabric, conn.id))]
    return {
        "@odata.id": endpoint_uri(tgt.fabric, tgt.id),
        "@odata.type": "#Endpoint.v1_8_0.Endpoint",
        "Id": tgt.id,
        "Name": f"{tgt.model} {tgt.serial}",
        "EntityRole": "Target",
        "EndpointProtocol": inv.fabrics[tgt.fabric],
        "ConnectedEntities": [
            {
                "EntityType": "Processor" if tgt.kind == "gpu" else "NetworkController",
                "EntityRole": "Target",
                "EntityPciId": pci,
            }
        ],
        "Status": {
            "State": "UnavailableOffline" if dev.foreign_owner else "Enabled",
            "Health": dev.health,
        },
        "Links": links,
        "Oem": {"Patchbay": oem},
    }


_CONN_STATE = {"Attaching": "Starting", "Attached": "Enabled", "Detaching": "Disabled"}


def connection(inv: Inventory, conn: Connection, task: Task | None) -> Json:
    ini, tgt = inv.initiators[conn.initiator], inv.targets[conn.device]
    oem: Json = {"State": conn.state, "Node": ini.node, "Adapter": ini.adapter}
    if conn.bdf and conn.state == "Attached":
        oem["PciBusId"] = conn.bdf
    if task is not None:
        oem["Task"] = link(task_uri(task.id))
    return {
        "@odata.id": connection_uri(tgt.fabric, conn.id),
        "@odata.type": "#Connection.v1_3_0.Connection",
        "Id": str(conn.id),
        "Name": f"{conn.device} to {conn.initiator}",
        "Status": {"State": _CONN_STATE[conn.state], "Health": "OK"},
        "Links": {
            "InitiatorEndpoints": [link(endpoint_uri(ini.fabric, ini.id))],
            "TargetEndpoints": [link(endpoint_uri(tgt.fabric, tgt.id))],
        },
        "Oem": {"Patchbay": oem},
    }


def task(inv: Inventory, t: Task) -> Json:
    tgt = inv.targets[t.device]
    messages = []
    if t.message:
        kind = "OperationFailed" if t.state == "Exception" else "GeneralError"
        messages.append(message(kind, t.message))
    out: Json = {
        "@odata.id": task_uri(t.id),
        "@odata.type": "#Task.v1_7_0.Task",
        "Id": str(t.id),
        "Name": f"{t.kind} {t.device} {'to' if t.kind == 'attach' else 'from'} {t.initiator}",
        "TaskState": t.state,
        "TaskStatus": "Critical" if t.state == "Exception" else "OK",
        "TaskMonitor": task_uri(t.id),
        "StartTime": _iso(t.started),
        "PercentComplete": 100 if t.done else 0,
        "Messages": messages,
        "Oem": {
            "Patchbay": {
                "Operation": t.kind,
                "Connection": link(connection_uri(tgt.fabric, t.connection)),
                "Target": link(endpoint_uri(tgt.fabric, t.device)),
                "Initiator": link(endpoint_uri(tgt.fabric, t.initiator)),
            }
        },
    }
    if t.ended is not None:
        out["EndTime"] = _iso(t.ended)
    return out
