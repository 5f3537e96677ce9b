"""NVMe drives and CXL Type 3 memory as fabric slots (issue 22): the topology
file's new kinds, their standard identities and where the resources put them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driver.errors import ConfigError
from fabric.service import hardware, inventory, redfish
from fabric.service.store import Connection


def spec(fabric_type: str) -> dict[str, Any]:
    up = {"port": "up0", "node": "node-a", "adapter": "adapter0", "hostDir": "node-a"}
    slots = [
        {"port": "s0", "device": {"kind": "nvme", "id": "nvme-0", "serial": "S6CRNA0R500123"}},
        {"port": "s1", "device": {"kind": "cxlmem", "id": "cxl-0", "serial": 0x4C1D96FFFEDDD835}},
    ]
    switch = {"id": "sw0", "upstream": [up], "slots": slots}
    return {"fabrics": [{"id": "f0", "type": fabric_type, "switches": [switch]}]}


def load(tmp_path: Path, fabric_type: str) -> inventory.Inventory:
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(spec(fabric_type)))
    return inventory.load(path)


def test_nvme_and_cxl_memory_slots_carry_their_standard_identity(tmp_path: Path) -> None:
    inv = load(tmp_path, "CXL")
    nvme, cxl = inv.targets["nvme-0"], inv.targets["cxl-0"]
    assert (nvme.kind, nvme.class_code, nvme.capacity_bytes) == (
        "nvme",
        0x010802,
        3_840_755_982_336,
    )
    assert nvme.nqn.endswith(":S6CRNA0R500123")
    assert (cxl.kind, cxl.class_code, cxl.capacity_bytes) == ("cxlmem", 0x050210, 256 << 30)
    assert cxl.serial == "4C-1D-96-FF-FE-DD-D8-35" and hardware.gcxlid(cxl).endswith(":0000")
    tree = hardware.tree(inv)
    drive = tree["/redfish/v1/Chassis/f0-sw0/Drives/nvme-0"]
    assert drive["Identifiers"] == [{"DurableNameFormat": "NQN", "DurableName": nvme.nqn}]
    ld = tree["/redfish/v1/Chassis/f0-sw0/PCIeDevices/cxl-0/CXLLogicalDevices/0"]
    assert ld["MemorySizeMiB"] == 256 * 1024
    chunk = ld["Links"]["MemoryChunks"][0]["@odata.id"]
    conn = redfish.connection(inv, Connection(1, "cxl-0", "node-a-adapter0", "Attaching", "", 0))
    assert conn["ConnectionType"] == "Memory" and conn["Status"]["State"] == "Starting"
    assert conn["MemoryChunkInfo"][0]["MemoryChunk"]["@odata.id"] == chunk in tree


def test_cxl_memory_needs_a_cxl_fabric(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"slots\[s1\]: CXL memory 'cxl-0' needs a fabric of type CXL"
    ):
        load(tmp_path, "PCIe")
