"""The hardware behind the fabric as Redfish shows it: hosts and pooled devices.

Why: a client that reads only standard places (issue 22) takes a device's
identity from the resource the standard puts it in, not from the fabric
Endpoint: a GPU's UUID from its ``Processor``, a NIC's MAC from its
``NetworkDeviceFunction``, an NVMe drive's serial and NQN from its ``Drive``,
a CXL memory device's serial (GCXLID) and size from its
``CXLLogicalDevice``, vendor/device ids and class codes from the
``PCIeDevice``/``PCIeFunction``; and it maps a node to its initiators
through the ``ComputerSystem`` (``HostName``, ``UUID``) and its
``FabricAdapters``.

All of it follows from the topology file, so :func:`tree` renders it once
into ``{uri: body}`` (collections included) and the service answers GETs
from that map. Pure functions, no I/O.
"""

from __future__ import annotations

import uuid as uuidlib

from fabric.service import uris
from fabric.service.inventory import Initiator, Inventory, Target
from fabric.service.uris import Json, link

_NS = uuidlib.UUID("5d0f4b8e-1c1a-4c55-9a55-2b7b0c6f7e21")
OK = {"State": "Enabled", "Health": "OK"}
DEVICE_CLASS = {
    "gpu": "DisplayController",
    "nic": "NetworkController",
    "nvme": "MassStorageController",
    "cxlmem": "MemoryController",
}
MANUFACTURER = {"gpu": "NVIDIA", "nic": "Mellanox", "nvme": "Samsung", "cxlmem": "Samsung"}


def system_uuid(node: str) -> str:
    """The ComputerSystem UUID of a node: deterministic, from its name."""
    return str(uuidlib.uuid5(_NS, node))


def bare_uuid(gpu_uuid: str) -> str:
    """NVML writes ``GPU-<uuid>``; Redfish's ``UUID`` (Edm.Guid) holds the bare UUID."""
    return gpu_uuid.removeprefix("GPU-")


def hex_id(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


def _collection(tree: dict[str, Json], uri: str, kind: str, members: list[str]) -> None:
    tree[uri] = {
        "@odata.id": uri,
        "@odata.type": f"#{kind}Collection.{kind}Collection",
        "Name": f"{kind} Collection",
        "Members@odata.count": len(members),
        "Members": [link(m) for m in members],
    }


def tree(inv: Inventory) -> dict[str, Json]:
    """Every ComputerSystem and Chassis resource of ``inv``, by URI."""
    out: dict[str, Json] = {}
    nodes = sorted({i.node for i in inv.initiators.values()})
    _collection(out, uris.SYSTEMS, "ComputerSystem", [uris.system_uri(n) for n in nodes])
    for node in nodes:
        _system(out, inv, node, [i for i in inv.initiators.values() if i.node == node])
    chassis = sorted({t.chassis for t in inv.targets.values()})
    _collection(out, uris.CHASSIS, "Chassis", [uris.chassis_uri(c) for c in chassis])
    for ch in chassis:
        _chassis(out, ch, [t for t in inv.targets.values() if t.chassis == ch])
    return out


def _system(out: dict[str, Json], inv: Inventory, node: str, adapters: list[Initiator]) -> None:
    uri = uris.system_uri(node)
    out[uri] = {
        "@odata.id": uri,
        "@odata.type": "#ComputerSystem.v1_27_0.ComputerSystem",
        "Id": node,
        "Name": f"node {node}",
        "SystemType": "Physical",
        "HostName": node,
        "UUID": system_uuid(node),
        "Status": OK,
        "FabricAdapters": link(f"{uri}/FabricAdapters"),
    }
    ordered = sorted(adapters, key=lambda a: a.adapter)
    members = [uris.adapter_uri(node, a.adapter) for a in ordered]
    _collection(out, f"{uri}/FabricAdapters", "FabricAdapter", members)
    for ini in ordered:
        a_uri = uris.adapter_uri(node, ini.adapter)
        protocol = inv.fabrics[ini.fabric]
        out[a_uri] = {
            "@odata.id": a_uri,
            "@odata.type": "#FabricAdapter.v1_5_3.FabricAdapter",
            "Id": ini.adapter,
            "Name": f"{node} fabric adapter {ini.adapter}",
            "FabricType": protocol,
            "Status": OK,
            "Ports": link(f"{a_uri}/Ports"),
            "Links": {"Endpoints": [link(uris.endpoint_uri(ini.fabric, ini.id))]},
        }
        p_uri = uris.adapter_port_uri(node, ini.adapter)
        _collection(out, f"{a_uri}/Ports", "Port", [p_uri])
        out[p_uri] = {
            "@odata.id": p_uri,
            "@odata.type": "#Port.v1_18_0.Port",
            "Id": "0",
            "Name": f"{node} {ini.adapter} port 0",
            "PortProtocol": protocol,
            "PortType": "UpstreamPort",
            "Status": OK,
            "Links": {
                "AssociatedEndpoints": [link(uris.endpoint_uri(ini.fabric, ini.id))],
                "ConnectedPorts": [link(uris.port_uri(ini.fabric, ini.switch, ini.port))],
            },
        }


def _chassis(out: dict[str, Json], ch: str, targets: list[Target]) -> None:
    uri = uris.chassis_uri(ch)
    kinds = {t.kind for t in targets}
    body: Json = {
        "@odata.id": uri,
        "@odata.type": "#Chassis.v1_28_0.Chassis",
        "Id": ch,
        "Name": f"fabric enclosure {ch}",
        "ChassisType": "Enclosure",
        "Status": OK,
        "PCIeDevices": link(f"{uri}/PCIeDevices"),
    }
    by_kind = {
        "gpu": ("Processors", "Processor", uris.processor_uri),
        "nic": ("NetworkAdapters", "NetworkAdapter", uris.network_adapter_uri),
        "nvme": ("Drives", "Drive", uris.drive_uri),
        "cxlmem": ("MemoryDomains", "MemoryDomain", uris.memory_domain_uri),
    }
    for kind, (prop, schema, member) in by_kind.items():
        if kind in kinds:
            body[prop] = link(f"{uri}/{prop}")
            ids = sorted(t.id for t in targets if t.kind == kind)
            _collection(out, f"{uri}/{prop}", schema, [member(ch, d) for d in ids])
    out[uri] = body
    # One PCIeDevice per physical device: the LDs of an MLD share theirs.
    physical = {t.pcie_id: t for t in sorted(targets, key=lambda t: t.id, reverse=True)}
    ids = sorted(physical)
    _collection(out, f"{uri}/PCIeDevices", "PCIeDevice", [uris.pcie_device_uri(ch, d) for d in ids])
    for d in ids:
        out.update(_pcie(physical[d]))
    for t in sorted(targets, key=lambda t: t.id):
        out.update(_function_of(t))
    for d in ids:
        if physical[d].kind == "cxlmem":
            lds = sorted(t.ld for t in targets if t.pcie_id == d)
            members = [uris.cxl_device_uri(ch, d, k) for k in lds]
            logical = f"{uris.pcie_device_uri(ch, d)}/CXLLogicalDevices"
            _collection(out, logical, "CXLLogicalDevice", members)


def _pcie(t: Target) -> dict[str, Json]:
    """The PCIeDevice (and its function) of ``t``'s physical device: for the LDs
    of an MLD, the one they share (``t`` is LD 0, naming the whole device)."""
    ch, uri = t.chassis, uris.pcie_device_uri(t.chassis, t.pcie_id)
    f_uri = uris.pcie_function_uri(ch, t.pcie_id)
    links: Json = {}
    if t.kind == "gpu":
        links["Processor"] = link(uris.processor_uri(ch, t.id))
    elif t.kind == "nic":
        links["NetworkDeviceFunctions"] = [link(uris.network_function_uri(ch, t.id))]
    elif t.kind == "nvme":
        links["Drives"] = [link(uris.drive_uri(ch, t.id))]
    elif t.kind == "cxlmem":
        lds = [uris.cxl_device_uri(ch, t.pcie_id, k) for k in range(t.lds)]
        links["CXLLogicalDevice"] = link(lds[0])
        links["MemoryDomains"] = [link(uris.memory_domain_uri(ch, t.id))]
    device: Json = {
        "@odata.id": uri,
        "@odata.type": "#PCIeDevice.v1_21_0.PCIeDevice",
        "Id": t.pcie_id,
        "Name": f"{t.model} in {ch}",
        "Manufacturer": MANUFACTURER[t.kind],
        "Model": t.model,
        "SerialNumber": t.serial,
        "DeviceType": "SingleFunction",
        "Status": OK,
        "PCIeFunctions": link(f"{uri}/PCIeFunctions"),
    }
    if t.kind == "cxlmem":
        device["CXLDevice"] = {"DeviceType": "Type3", "MaxNumberLogicalDevices": t.lds}
        device["CXLLogicalDevices"] = link(f"{uri}/CXLLogicalDevices")
    function: Json = {
        "@odata.id": f_uri,
        "@odata.type": "#PCIeFunction.v1_7_0.PCIeFunction",
        "Id": "0",
        "Name": f"{t.pcie_id} function 0",
        "FunctionId": 0,
        "FunctionType": "Physical",
        "DeviceClass": DEVICE_CLASS[t.kind],
        "ClassCode": hex_id(t.class_code, 6),
        "VendorId": hex_id(t.vendor_id, 4),
        "DeviceId": hex_id(t.device_id, 4),
        "Status": OK,
        "Links": {"PCIeDevice": link(uri), **links},
    }
    out = {uri: device, f_uri: function}
    _collection(out, f"{uri}/PCIeFunctions", "PCIeFunction", [f_uri])
    return out


def _function_of(t: Target) -> dict[str, Json]:
    """The resource that carries the device's identity, by kind (issue 22's contract)."""
    ch = t.chassis
    pcie = link(uris.pcie_device_uri(ch, t.pcie_id))
    functions = [link(uris.pcie_function_uri(ch, t.pcie_id))]
    base = {"Name": f"{t.model} {t.serial}", "Status": OK}
    out: dict[str, Json] = {}
    if t.kind == "gpu":
        uri = uris.processor_uri(ch, t.id)
        out[uri] = {
            "@odata.id": uri, "@odata.type": "#Processor.v1_22_0.Processor", "Id": t.id, **base,
            "ProcessorType": "GPU", "Manufacturer": "NVIDIA", "Model": t.model,
            "SerialNumber": t.serial, "UUID": bare_uuid(t.uuid),
            "Links": {"PCIeDevice": pcie, "PCIeFunctions": functions},
        }  # fmt: skip
    elif t.kind == "nic":
        uri = uris.network_adapter_uri(ch, t.id)
        f_uri = uris.network_function_uri(ch, t.id)
        out[uri] = {
            "@odata.id": uri, "@odata.type": "#NetworkAdapter.v1_14_0.NetworkAdapter",
            "Id": t.id, **base, "Manufacturer": "Mellanox", "Model": t.model,
            "SerialNumber": t.serial,
            "NetworkDeviceFunctions": link(f"{uri}/NetworkDeviceFunctions"),
        }  # fmt: skip
        _collection(out, f"{uri}/NetworkDeviceFunctions", "NetworkDeviceFunction", [f_uri])
        out[f_uri] = {
            "@odata.id": f_uri,
            "@odata.type": "#NetworkDeviceFunction.v1_11_1.NetworkDeviceFunction",
            "Id": "0", **base, "NetDevFuncType": "Ethernet",
            "Ethernet": {"PermanentMACAddress": t.mac, "MACAddress": t.mac},
            "Links": {"PCIeFunction": functions[0]},
        }  # fmt: skip
    elif t.kind == "nvme":
        uri = uris.drive_uri(ch, t.id)
        out[uri] = {
            "@odata.id": uri, "@odata.type": "#Drive.v1_22_0.Drive", "Id": t.id, **base,
            "Protocol": "NVMe", "MediaType": "SSD", "Manufacturer": "Samsung", "Model": t.model,
            "SerialNumber": t.serial, "CapacityBytes": t.capacity_bytes,
            "Identifiers": [{"DurableNameFormat": "NQN", "DurableName": t.nqn}],
            "Links": {"PCIeFunctions": functions},
        }  # fmt: skip
    else:
        out.update(_cxl(t, functions))
    return out


def _cxl(t: Target, functions: list[Json]) -> dict[str, Json]:
    ch = t.chassis
    ld, dom, chunk = (
        uris.cxl_device_uri(ch, t.pcie_id, t.ld),
        uris.memory_domain_uri(ch, t.id),
        uris.memory_chunk_uri(ch, t.id),
    )
    mib = t.capacity_bytes >> 20
    out: dict[str, Json] = {
        ld: {
            "@odata.id": ld, "@odata.type": "#CXLLogicalDevice.v1_3_0.CXLLogicalDevice",
            "Id": str(t.ld), "Name": f"{t.pcie_id} logical device {t.ld}", "Status": OK,
            "Identifiers": [{"DurableNameFormat": "GCXLID", "DurableName": gcxlid(t)}],
            "SemanticsSupported": ["CXLio", "CXLmem"], "MemorySizeMiB": mib,
            "Links": {
                "PCIeFunctions": functions, "MemoryDomains": [link(dom)],
                "MemoryChunks": [link(chunk)],
            },
        },
        dom: {
            "@odata.id": dom, "@odata.type": "#MemoryDomain.v1_5_1.MemoryDomain", "Id": t.id,
            "Name": f"{t.id} memory domain", "MemoryChunks": link(f"{dom}/MemoryChunks"),
            "Links": {"CXLLogicalDevices": [link(ld)], "PCIeFunctions": functions},
        },
        chunk: {
            "@odata.id": chunk, "@odata.type": "#MemoryChunks.v1_6_2.MemoryChunks", "Id": "0",
            "Name": f"{t.id} memory chunk 0", "Status": OK, "MemoryChunkSizeMiB": mib,
            "AddressRangeType": "Volatile", "AddressRangeOffsetMiB": 0,
            "MediaLocation": "Remote", "Links": {"CXLLogicalDevices": [link(ld)]},
        },
    }  # fmt: skip
    _collection(out, f"{dom}/MemoryChunks", "MemoryChunks", [chunk])
    return out


def gcxlid(t: Target) -> str:
    """The logical device's GCXLID: the device serial (EUI-64) and its LD id
    (0 for a single-logical device), four hex digits."""
    return f"{t.serial}:{t.ld:04X}"


def entity_link(t: Target) -> str:
    """The resource a target endpoint's ``ConnectedEntities[0].EntityLink`` names."""
    if t.kind == "cxlmem":  # the endpoint's own LD
        return uris.cxl_device_uri(t.chassis, t.pcie_id, t.ld)
    by_kind = {"gpu": uris.processor_uri, "nic": uris.network_adapter_uri, "nvme": uris.drive_uri}
    return by_kind[t.kind](t.chassis, t.id)
