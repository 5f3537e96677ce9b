"""A small mockup of our own: a CXL fabric of two switches, written as DMTF mockups are.

Why: DMTF's public CXL mockup has one switch and no device in two
Connections; the shapes the client got wrong (issue 35) need a fabric that
has them, small enough to read in one sitting:

- switch ``sw1`` carries the hosts (``host-a`` with two adapters, ``host-b``)
  and a GPU without a UUID; switch ``sw2`` the memory; one inter-switch link
  joins them (its ports name each other, and ``sw2``'s names itself too: a loop);
- ``mem-3`` (a single logical device) sits in two Connections, ``c1`` and
  ``c2``, both to ``host-a`` (through its two adapters);
- ``ld-1`` and ``ld-2`` are the two logical devices of one multi-logical
  device (one serial, LD ``0001`` and ``0002``); ``ld-2`` is attached to
  ``host-b`` (``c3``), and the Endpoints collection omits it;
- the memory endpoints name no switch port themselves: their switch port's
  ``AssociatedEndpoints`` names them.

:func:`two_switch_tree` gives the resources by URI (for ``MockupServer``);
:func:`write_mockup` writes any such tree as a mockup folder (``index.json``
per resource), which DMTF's Redfish-Mockup-Server serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = "/redfish/v1"
FAB = f"{ROOT}/Fabrics/CXL2"
EPS, CONNS = f"{FAB}/Endpoints", f"{FAB}/Connections"
CONNECTION_TYPE = "#Connection.v1_4_0.Connection"
MLD_SERIAL = "0x4c1d96fffe000001"  # GCXLID 4C-1D-96-FF-FE-00-00-01 as memX/serial shows it


def _l(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def _coll(uri: str, members: list[str], kind: str) -> dict[str, Any]:
    return {
        "@odata.id": uri,
        "@odata.type": f"#{kind}Collection.{kind}Collection",
        "Name": f"{kind} collection",
        "Members@odata.count": len(members),
        "Members": [_l(m) for m in members],
    }


def _port(sw: str, port: str, ends: list[str], peers: list[str]) -> dict[str, Any]:
    uri = f"{FAB}/Switches/{sw}/Ports/{port}"
    return {
        "@odata.id": uri,
        "@odata.type": "#Port.v1_11_0.Port",
        "Id": port,
        "Name": port,
        "Links": {
            "AssociatedEndpoints": [_l(f"{EPS}/{e}") for e in ends],
            "ConnectedPorts": [_l(f"{FAB}/Switches/{p}") for p in peers],
        },
    }


def _initiator(ep: str, host: str, adapter: str, port: str, conns: list[str]) -> dict[str, Any]:
    system = f"{ROOT}/Systems/{host}"
    return {
        "@odata.id": f"{EPS}/{ep}",
        "@odata.type": "#Endpoint.v1_8_0.Endpoint",
        "Id": ep,
        "Name": ep,
        "EndpointProtocol": "CXL",
        "ConnectedEntities": [
            {"EntityType": "RootComplex", "EntityRole": "Initiator", "EntityLink": _l(system)}
        ],
        "Links": {
            "LocalPorts": [_l(f"{system}/FabricAdapters/{adapter}/Ports/0")],
            "ConnectedPorts": [_l(f"{FAB}/Switches/sw1/Ports/{port}")],
            "Connections": [_l(f"{CONNS}/{c}") for c in conns],
        },
    }


def _memory(ep: str, ld: str, conns: list[str]) -> dict[str, Any]:
    return {
        "@odata.id": f"{EPS}/{ep}",
        "@odata.type": "#Endpoint.v1_8_0.Endpoint",
        "Id": ep,
        "Name": ep,
        "EndpointProtocol": "CXL",
        "ConnectedEntities": [
            {
                "EntityType": "CXLDevice",
                "EntityRole": "Target",
                "EntityLink": _l(ld),
                "EntityPciId": {"VendorId": "0x1e98", "DeviceId": "0x0001"},
            }
        ],
        "Links": {"Connections": [_l(f"{CONNS}/{c}") for c in conns]},
    }


def _ld(uri: str, gcxlid: str) -> dict[str, Any]:
    return {
        "@odata.id": uri,
        "@odata.type": "#CXLLogicalDevice.v1_1_0.CXLLogicalDevice",
        "Id": uri.rsplit("/", 1)[-1],
        "Name": "logical device",
        "MemorySizeMiB": 32768,
        "SemanticsSupported": ["CXLio", "CXLmem"],
        "Identifiers": [{"DurableNameFormat": "GCXLID", "DurableName": gcxlid}],
    }


def _connection(cid: str, initiator: str, target: str) -> dict[str, Any]:
    return {
        "@odata.id": f"{CONNS}/{cid}",
        "@odata.type": CONNECTION_TYPE,
        "Id": cid,
        "Name": cid,
        "ConnectionType": "Memory",
        "Status": {"State": "Enabled", "Health": "OK"},
        "Links": {
            "InitiatorEndpoints": [_l(f"{EPS}/{initiator}")],
            "TargetEndpoints": [_l(f"{EPS}/{target}")],
        },
    }


def two_switch_tree() -> dict[str, dict[str, Any]]:
    """The fabric of the module docstring, by URI."""
    mld = f"{ROOT}/Chassis/mld/PCIeDevices/mld/CXLLogicalDevices"
    sld = f"{ROOT}/Chassis/sld/PCIeDevices/sld/CXLLogicalDevices/0"
    gpu = f"{ROOT}/Chassis/gpubox/Processors/gpu-0"
    t: dict[str, dict[str, Any]] = {
        ROOT: {
            "@odata.id": f"{ROOT}/",
            "@odata.type": "#ServiceRoot.v1_16_0.ServiceRoot",
            "Id": "RootService",
            "Name": "two-switch CXL fabric",
            "RedfishVersion": "1.18.0",
            "Fabrics": _l(f"{ROOT}/Fabrics"),
            "Systems": _l(f"{ROOT}/Systems"),
        },
        f"{ROOT}/Fabrics": _coll(f"{ROOT}/Fabrics", [FAB], "Fabric"),
        FAB: {
            "@odata.id": FAB,
            "@odata.type": "#Fabric.v1_3_0.Fabric",
            "Id": "CXL2",
            "Name": "CXL2",
            "FabricType": "CXL",
            "Endpoints": _l(EPS),
            "Connections": _l(CONNS),
            "Switches": _l(f"{FAB}/Switches"),
        },
        f"{FAB}/Switches": _coll(
            f"{FAB}/Switches", [f"{FAB}/Switches/sw1", f"{FAB}/Switches/sw2"], "Switch"
        ),
        f"{ROOT}/Systems": _coll(
            f"{ROOT}/Systems",
            [f"{ROOT}/Systems/host-a", f"{ROOT}/Systems/host-b"],
            "ComputerSystem",
        ),
        gpu: {
            "@odata.id": gpu,
            "@odata.type": "#Processor.v1_18_0.Processor",
            "Id": "gpu-0",
            "Name": "GPU without a UUID",
            "ProcessorType": "GPU",
            "Model": "H100",
            "SerialNumber": "G-0",
        },
        f"{mld}/1": _ld(f"{mld}/1", "4C-1D-96-FF-FE-00-00-01:0001"),
        f"{mld}/2": _ld(f"{mld}/2", "4C-1D-96-FF-FE-00-00-01:0002"),
        sld: _ld(sld, "4C-1D-96-FF-FE-00-00-02:0000"),
        f"{EPS}/ini-a1": _initiator("ini-a1", "host-a", "fa1", "h1", ["c1"]),
        f"{EPS}/ini-a2": _initiator("ini-a2", "host-a", "fa2", "h2", ["c2"]),
        f"{EPS}/ini-b": _initiator("ini-b", "host-b", "fa0", "h3", ["c3"]),
        f"{EPS}/ld-1": _memory("ld-1", f"{mld}/1", []),
        f"{EPS}/ld-2": _memory("ld-2", f"{mld}/2", ["c3"]),
        f"{EPS}/mem-3": _memory("mem-3", sld, ["c1", "c2"]),
        f"{EPS}/gpu-0": {
            "@odata.id": f"{EPS}/gpu-0",
            "@odata.type": "#Endpoint.v1_8_0.Endpoint",
            "Id": "gpu-0",
            "Name": "gpu-0",
            "ConnectedEntities": [
                {
                    "EntityType": "Processor",
                    "EntityRole": "Target",
                    "EntityLink": _l(gpu),
                    "EntityPciId": {"VendorId": "0x10de", "DeviceId": "0x2330"},
                }
            ],
            "Links": {"ConnectedPorts": [_l(f"{FAB}/Switches/sw1/Ports/g1")]},
        },
        f"{CONNS}/c1": _connection("c1", "ini-a1", "mem-3"),
        f"{CONNS}/c2": _connection("c2", "ini-a2", "mem-3"),
        f"{CONNS}/c3": _connection("c3", "ini-b", "ld-2"),
    }
    for host, uuid in (("host-a", "6A0C1E42-0000-4000-8000-00000000000A"),
                       ("host-b", "6A0C1E42-0000-4000-8000-00000000000B")):  # fmt: skip
        t[f"{ROOT}/Systems/{host}"] = {
            "@odata.id": f"{ROOT}/Systems/{host}",
            "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
            "Id": host,
            "Name": host,
            "HostName": f"node-{host[-1]}",
            "UUID": uuid,
        }
    ports = {
        "sw1": [_port("sw1", "h1", ["ini-a1"], []), _port("sw1", "h2", ["ini-a2"], []),
                _port("sw1", "h3", ["ini-b"], []), _port("sw1", "g1", ["gpu-0"], []),
                _port("sw1", "isl", [], ["sw2/Ports/isl"])],
        "sw2": [_port("sw2", "isl", [], ["sw1/Ports/isl", "sw2/Ports/isl"]),
                _port("sw2", "d1", ["ld-1", "ld-2"], []), _port("sw2", "d2", ["mem-3"], [])],
    }  # fmt: skip
    for sw, sw_ports in ports.items():
        base = f"{FAB}/Switches/{sw}"
        t[base] = {
            "@odata.id": base,
            "@odata.type": "#Switch.v1_9_0.Switch",
            "Id": sw,
            "Name": sw,
            "SwitchType": "CXL",
            "Ports": _l(f"{base}/Ports"),
        }
        t[f"{base}/Ports"] = _coll(f"{base}/Ports", [p["@odata.id"] for p in sw_ports], "Port")
        t |= {p["@odata.id"]: p for p in sw_ports}
    t[CONNS] = _coll(CONNS, [f"{CONNS}/c{i}" for i in (1, 2, 3)], "Connection")
    listed = ["ini-a1", "ini-a2", "ini-b", "gpu-0", "ld-1", "mem-3"]  # not ld-2
    t[EPS] = _coll(EPS, [f"{EPS}/{e}" for e in listed], "Endpoint")
    return t


def write_mockup(tree: dict[str, dict[str, Any]], folder: Path) -> Path:
    """``tree`` as a DMTF mockup folder in short form (as DMTF publishes them):
    ``<folder>/index.json`` is ``/redfish/v1``, ``<folder>/Fabrics/index.json`` its
    ``Fabrics``."""
    for uri, body in tree.items():
        path = folder / uri.removeprefix(ROOT).strip("/") / "index.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body, indent=1))
    return folder
