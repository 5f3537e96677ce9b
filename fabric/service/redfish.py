"""Redfish resource shapes of the fabric: the JSON of every fabric resource we serve.

Pure functions from the inventory and store rows to JSON, following the DMTF
schemas (ServiceRoot, Fabric, Switch, Port, Endpoint, Zone, Connection, Task)
and the wire contract of issue 22: every fact sits where the standard puts
it (roles in ``ConnectedEntities``, the linked hardware in ``hardware.py``,
connection progress in ``Status.State``). A DMTF validator finds nothing
wrong with them (tests/integration/test_redfish_conformance.py). There is
no ``Oem`` part: nothing reads one, and every fact has a standard place.
"""

from __future__ import annotations

import hashlib
import json
import time

from fabric.service import hardware, uris, vcs
from fabric.service.errors import message
from fabric.service.inventory import Initiator, Inventory, Target
from fabric.service.store import FAILED, Connection, DeviceState, Task
from fabric.service.uris import Json, link

# A connection's progress in Status.State; a failed one (outcomes.py) is
# present but unusable: UnavailableOffline with Health Critical.
CONN_STATE = {
    "Attaching": "Starting",
    "Attached": "Enabled",
    "Detaching": "Disabled",
    FAILED: "UnavailableOffline",
}
ENTITY_TYPE = {
    "gpu": "Processor",
    "nic": "NetworkController",
    "nvme": "Drive",
    "cxlmem": "CXLDevice",
}


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
        "@odata.id": uris.ROOT,
        "@odata.type": "#ServiceRoot.v1_20_0.ServiceRoot",
        "Id": "RootService",
        "Name": "patchbay simulated fabric",
        "RedfishVersion": "1.18.0",
        "UUID": hardware.system_uuid("patchbay-fabric"),
        "Vendor": "patchbay",
        "Product": "patchbay simulated PCIe/CXL fabric",
        "Fabrics": link(uris.FABRICS),
        "Systems": link(uris.SYSTEMS),
        "Chassis": link(uris.CHASSIS),
        "Tasks": link(uris.TASK_SERVICE),
        "SessionService": link(uris.SESSION_SERVICE),
        "AccountService": link(uris.ACCOUNT_SERVICE),
        "EventService": link(uris.EVENT_SERVICE),
        "Links": {"Sessions": link(uris.SESSIONS)},
        "ProtocolFeaturesSupported": {
            "ExpandQuery": {"ExpandAll": False, "Levels": False, "Links": False, "NoLinks": True},
            "FilterQuery": False,
            "SelectQuery": False,
            "OnlyMemberQuery": False,
            "ExcerptQuery": False,
        },
    }


def fabric(inv: Inventory, ident: str) -> Json:
    uri = uris.fabric_uri(ident)
    return {
        "@odata.id": uri,
        "@odata.type": "#Fabric.v1_4_0.Fabric",
        "Id": ident,
        "Name": f"{inv.fabrics[ident]} fabric {ident}",
        "FabricType": inv.fabrics[ident],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Switches": link(f"{uri}/Switches"),
        "Endpoints": link(f"{uri}/Endpoints"),
        "Zones": link(f"{uri}/Zones"),
        "Connections": link(f"{uri}/Connections"),
    }


def switch(inv: Inventory, fab: str, ident: str) -> Json:
    uri = uris.switch_uri(fab, ident)
    body: Json = {
        "@odata.id": uri,
        "@odata.type": "#Switch.v1_11_0.Switch",
        "Id": ident,
        "Name": f"switch {ident}",
        "SwitchType": inv.fabrics[fab],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Ports": link(f"{uri}/Ports"),
    }
    cxl = vcs.switch_cxl(inv, fab, ident)  # its host ports' virtual switches (adapter room)
    if cxl is not None:
        body["CXL"] = cxl
    return body


def port(inv: Inventory, fab: str, sw: str, ident: str) -> Json:
    up = [i for i in inv.initiators.values() if (i.fabric, i.switch, i.port) == (fab, sw, ident)]
    down = [t for t in inv.targets.values() if (t.fabric, t.switch, t.port) == (fab, sw, ident)]
    ends = [uris.endpoint_uri(fab, i.id) for i in up] + [uris.endpoint_uri(fab, t.id) for t in down]
    links: Json = {"AssociatedEndpoints": [link(u) for u in ends]}
    if up:  # the host adapter's port at the other end of the cable
        links["ConnectedPorts"] = [link(uris.adapter_port_uri(i.node, i.adapter)) for i in up]
    return {
        "@odata.id": uris.port_uri(fab, sw, ident),
        "@odata.type": "#Port.v1_18_0.Port",
        "Id": ident,
        "Name": f"port {ident}",
        "PortProtocol": inv.fabrics[fab],
        "PortType": "UpstreamPort" if up else "DownstreamPort",
        "Status": {"State": "Enabled" if ends else "Absent", "Health": "OK"},
        "Links": links,
    }


def initiator(inv: Inventory, ini: Initiator) -> Json:
    return {
        "@odata.id": uris.endpoint_uri(ini.fabric, ini.id),
        "@odata.type": "#Endpoint.v1_8_2.Endpoint",
        "Id": ini.id,
        "Name": f"{ini.node} adapter {ini.adapter}",
        "EndpointProtocol": inv.fabrics[ini.fabric],
        "ConnectedEntities": [
            {
                "EntityType": "RootComplex",
                "EntityRole": "Initiator",
                "EntityLink": link(uris.system_uri(ini.node)),
            }
        ],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Links": {
            # Not the deprecated Links.Ports (Endpoint v1_7_0 moved it here).
            "LocalPorts": [link(uris.adapter_port_uri(ini.node, ini.adapter))],
            "ConnectedPorts": [link(uris.port_uri(ini.fabric, ini.switch, ini.port))],
            "Zones": [link(uris.zone_uri(ini.fabric, ini.id))],
        },
    }


def target(inv: Inventory, tgt: Target, dev: DeviceState, conn: Connection | None) -> Json:
    entity: Json = {
        "EntityType": ENTITY_TYPE[tgt.kind],
        "EntityRole": "Target",
        "EntityLink": link(hardware.entity_link(tgt)),
        "EntityPciId": {
            "VendorId": hardware.hex_id(tgt.vendor_id, 4),
            "DeviceId": hardware.hex_id(tgt.device_id, 4),
            "ClassCode": hardware.hex_id(tgt.class_code, 6),
        },
    }
    if tgt.kind == "cxlmem":
        entity["Identifiers"] = [
            {"DurableNameFormat": "GCXLID", "DurableName": hardware.gcxlid(tgt)}
        ]
    elif tgt.kind == "nvme":
        entity["Identifiers"] = [{"DurableNameFormat": "NQN", "DurableName": tgt.nqn}]
    links: Json = {"ConnectedPorts": [link(uris.port_uri(tgt.fabric, tgt.switch, tgt.port))]}
    if conn is not None:
        links["Connections"] = [link(uris.connection_uri(tgt.fabric, conn.id))]
        if conn.state != "Detaching":
            links["Zones"] = [link(uris.zone_uri(tgt.fabric, conn.initiator))]
    return {
        "@odata.id": uris.endpoint_uri(tgt.fabric, tgt.id),
        "@odata.type": "#Endpoint.v1_8_2.Endpoint",
        "Id": tgt.id,
        "Name": f"{tgt.model} {tgt.serial}",
        "EndpointProtocol": inv.fabrics[tgt.fabric],
        "ConnectedEntities": [entity],
        "Status": {
            "State": "UnavailableOffline" if dev.foreign_owner else "Enabled",
            "Health": dev.health,
        },
        "Links": links,
    }


def connection(inv: Inventory, conn: Connection) -> Json:
    ini, tgt = inv.initiators[conn.initiator], inv.targets[conn.device]
    body: Json = {
        "@odata.id": uris.connection_uri(tgt.fabric, conn.id),
        "@odata.type": "#Connection.v1_4_0.Connection",
        "Id": str(conn.id),
        "Name": f"{conn.device} to {conn.initiator}",
        "Status": {
            "State": CONN_STATE[conn.state],
            "Health": "Critical" if conn.state == FAILED else "OK",
        },
        "Links": {
            "InitiatorEndpoints": [link(uris.endpoint_uri(ini.fabric, ini.id))],
            "TargetEndpoints": [link(uris.endpoint_uri(tgt.fabric, tgt.id))],
        },
    }
    if tgt.kind == "cxlmem":
        body["ConnectionType"] = "Memory"
        body["MemoryChunkInfo"] = [
            {
                "AccessCapabilities": ["Read", "Write"],
                "MemoryChunk": link(uris.memory_chunk_uri(tgt.chassis, tgt.id)),
            }
        ]
    return body


def zone_members(ini: Initiator, conns: list[Connection]) -> list[str]:
    """The zone of ``ini``: the initiator, then every target attached, attaching or
    failed (its connection's ``Status`` tells which) to it."""
    targets = sorted(c.device for c in conns if c.initiator == ini.id and c.state != "Detaching")
    return [uris.endpoint_uri(ini.fabric, ini.id)] + [
        uris.endpoint_uri(ini.fabric, t) for t in targets
    ]


def zone_etag(members: list[str]) -> str:
    return 'W/"' + hashlib.sha256(json.dumps(members).encode()).hexdigest()[:16] + '"'


def zone(ini: Initiator, conns: list[Connection]) -> Json:
    """The zone of ``ini``; a member whose connection failed makes its ``HealthRollup`` Critical."""
    members = zone_members(ini, conns)
    failed = any(c.initiator == ini.id and c.state == FAILED for c in conns)
    return {
        "@odata.id": uris.zone_uri(ini.fabric, ini.id),
        "@odata.type": "#Zone.v1_6_3.Zone",
        "@odata.etag": zone_etag(members),
        "Id": ini.id,
        "Name": f"zone of {ini.node} adapter {ini.adapter}",
        "ZoneType": "ZoneOfEndpoints",
        "Status": {
            "State": "Enabled",
            "Health": "OK",
            "HealthRollup": "Critical" if failed else "OK",
        },
        "Links": {"Endpoints": [link(m) for m in members]},
    }


def task(t: Task) -> Json:
    messages = []
    if t.message:
        kind = "OperationFailed" if t.state == "Exception" else "GeneralError"
        messages.append(message(kind, t.message))
    out: Json = {
        "@odata.id": uris.task_uri(t.id),
        "@odata.type": "#Task.v1_7_4.Task",
        "Id": str(t.id),
        "Name": f"{t.kind} {t.device} {'to' if t.kind == 'attach' else 'from'} {t.initiator}",
        "TaskState": t.state,
        "TaskStatus": "Critical" if t.state == "Exception" else "OK",
        "TaskMonitor": uris.monitor_uri(t.id),
        "StartTime": _iso(t.started),
        "PercentComplete": 100 if t.done else 0,
        "Messages": messages,
    }
    if t.ended is not None:
        out["EndTime"] = _iso(t.ended)
    return out


def samples(inv: Inventory) -> list[Json]:
    """One body of every kind this module renders (for ``$metadata``'s schema list)."""
    out = [service_root()]
    kinds = ("Fabric", "Switch", "Port", "Endpoint", "Zone", "Connection", "Task", "Session")
    out += [collection("", kind, [], False) for kind in kinds]
    for f in inv.fabrics:
        out.append(fabric(inv, f))
    for key, ports in list(inv.switches.items())[:1]:
        f, sw = key.split("/", 1)
        out += [switch(inv, f, sw), port(inv, f, sw, ports[0])]
    for ini in list(inv.initiators.values())[:1]:
        out += [initiator(inv, ini), zone(ini, [])]
    for ini in [i for i in inv.initiators.values() if i.vppbs][:1]:  # adapter room (vcs.py)
        out += [collection("", k, [], False) for k in ("VirtualCXLSwitch", "VirtualPCI2PCIBridge")]
        out += [vcs.vcs(ini), vcs.vppb(inv, ini, "1", [])]
    for tgt in inv.targets.values():
        state = DeviceState(tgt.id, "OK", False, "")
        conn = Connection(0, tgt.id, next(iter(inv.initiators)), "Attached", "", 0.0)
        row = Task(0, "attach", 0, tgt.id, conn.initiator, "Completed", False, "x", 0.0, 0.0)
        out += [target(inv, tgt, state, None), connection(inv, conn), task(row)]
    return out
