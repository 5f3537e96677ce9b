"""The fabric client reads standard Redfish bodies: DMTF's own mockups and the
session's wire contract, served over HTTP by a local server.

Each of these failed on the pre-standard parser, which required a top-level
``Endpoint.EntityRole`` and ``Oem.Patchbay`` values the schemas do not have.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.fabric_standard_server import (
    GPU_UUID,
    NIC_MAC,
    REPO,
    ROOT,
    MockupServer,
    contract_tree,
)
from tests.unit.fabric_standard_server import serving as client

CXL_SYSTEM_UUID = "68D5E212-165B-4CA0-909B-C86B9CEE0112"
CXL_SERIAL = "0x4c1d96fffeddd835"  # GCXLID 4C-1D-96-FF-FE-DD-D8-35 as memX/serial shows it


async def test_cxl_mockup_gives_kinds_identities_initiators_and_reachability() -> None:
    async with client(MockupServer("public-cxl"), systems={"CXL-System": "node-a"}) as fc:
        inv = await fc.inventory()
    # T1 is a Type 1 FPGA and endpoint 1 the switch itself: no device of ours.
    assert {d.id: d.kind for d in inv.devices} == {
        "T2": "gpu", "T3": "cxlmem", "T4": "cxlmem", "T5": "cxlmem",
    }  # fmt: skip
    t3 = inv.device("T3")
    assert (t3.identity, t3.capacity_bytes, t3.vendor_id) == (CXL_SERIAL, 16 << 30, 0xABCD)
    assert t3.health == "OK" and t3.available and t3.switch == "CXL"
    # Initiators: the system's endpoints, mapped to node-a by the setting; no
    # FabricAdapter in their port links: the endpoint Id. The mockup's collections
    # omit I4 and its Connection 14; T4's Links.Connections names 14, which names I4.
    assert sorted((a.node, a.adapter) for a in inv.adapters) == [
        ("node-a", "I1"), ("node-a", "I2"), ("node-a", "I3"), ("node-a", "I4"),
    ]  # fmt: skip
    t4 = inv.device("T4").connection
    assert t4 is not None and (t4.id, t4.adapter) == ("14", "I4")
    assert {a.system_uuid for a in inv.adapters} == {CXL_SYSTEM_UUID}
    # One switch: every device is reachable from every initiator.
    assert all({a.endpoint for a in d.adapters} == {"I1", "I2", "I3"} for d in inv.devices)
    # Connections 12 (I2-T2) and 13 (I3-T3), both Enabled.
    assert t3.connection is not None and t3.in_use
    assert (t3.connection.node, t3.connection.adapter, t3.connection.state) == (
        "node-a", "I3", "Attached",
    )  # fmt: skip
    t2 = inv.device("T2").connection
    assert t2 is not None and t2.adapter == "I2" and inv.device("T5").connection is None


async def test_without_a_mapping_the_system_uuid_is_reported_for_node_matching() -> None:
    async with client(MockupServer("public-cxl")) as fc:
        inv = await fc.inventory()
    assert {(a.node, a.system_uuid) for a in inv.adapters} == {("", CXL_SYSTEM_UUID)}


async def test_a_node_reporting_the_system_uuid_names_it() -> None:
    """The controller passes the Nodes' systemUUIDs; the CXL mockup's system
    has no HostName, so its UUID names the node (case-insensitively)."""
    async with client(MockupServer("public-cxl")) as fc:
        fc.set_node_uuids({CXL_SYSTEM_UUID.lower(): "node-u"})
        inv = await fc.inventory()
    assert {a.node for a in inv.adapters} == {"node-u"}
    t3 = inv.device("T3").connection
    assert t3 is not None and t3.node == "node-u"


async def test_a_system_host_name_names_the_node() -> None:
    server = MockupServer("public-cxl")
    system = f"{ROOT}/Systems/CXL-System"
    server.bodies[system] = {**server.bodies[system], "HostName": "worker-7"}
    async with client(server) as fc:
        inv = await fc.inventory()
    assert {a.node for a in inv.adapters} == {"worker-7"}


async def test_nvmeof_jbof_volumes_and_nqn_endpoints_parse() -> None:
    async with client(MockupServer("public-nvmeof-jbof")) as fc:
        inv = await fc.inventory()
    assert inv.devices == () and inv.adapters == ()  # NVMe-oF is parsed, never attached
    nqns = {e.id: (e.role, e.nqn) for e in inv.nqn_endpoints}
    assert nqns["Target1"] == ("Target", "nqn.corp.com:nvme:nvm-subsys-sn-7642")
    assert nqns["Initiator1"] == ("Initiator", "host.corp.com:nvme:nvm-subsys-sn-4635")
    # Connection 3 grants volumes 3 and 4 to InitiatorEndpointGroups/1 (both
    # initiators): read, and each volume listed once (it was listed twice, the
    # group's grant lost).
    granted = {v.uri.rsplit("/", 1)[-1]: tuple(sorted(v.initiators)) for v in inv.volumes}
    assert len(inv.volumes) == len(granted)
    both = ("Initiator1", "Initiator2")
    assert granted == {"1": ("Initiator1",), "2": ("Initiator2",), "3": both, "4": both}
    vol1 = next(v for v in inv.volumes if v.uri.endswith("/Volumes/1"))
    assert vol1.capacity_bytes == 899527000064
    assert vol1.nguid == "01000000010000002233445566778899"


async def test_expansion_box_drives_list_without_reachability() -> None:
    async with client(MockupServer("public-expansion-box")) as fc:
        drives = await fc.drives()
    # Four NVMe drives in tray 2; tray 1's SAS drives are no NVMe device.
    assert [d.uri.rsplit("/", 3)[-3] for d in drives] == [
        "Tray2-Drive1", "Tray2-Drive2", "Tray2-Drive3", "Tray2-Drive4",
    ]  # fmt: skip
    assert all(d.kind == "nvme" and d.capacity_bytes == 256 << 30 for d in drives)
    assert all(d.adapters == () and d.connection is None for d in drives)


async def test_contract_shape_gives_every_kind_its_identity() -> None:
    async with client(MockupServer(bodies=contract_tree())) as fc:
        inv = await fc.inventory()
    (adapter,) = inv.adapters
    assert (adapter.node, adapter.adapter, adapter.switch) == ("node-a", "adapter0", "sw0")
    gpu, nic = inv.device("gpu-0"), inv.device("nic-0")
    nvme, cxl = inv.device("nvme-0"), inv.device("cxl-0")
    assert (gpu.kind, gpu.identity, gpu.model, gpu.vendor_id) == (
        "gpu", f"GPU-{GPU_UUID.lower()}", "H200", 0x10DE,
    )  # fmt: skip
    assert (nic.kind, nic.identity, nic.model, nic.serial) == ("nic", NIC_MAC.lower(), "CX7", "N1")
    assert (nvme.kind, nvme.identity, nvme.capacity_bytes) == ("nvme", "S3X1", 3840 << 30)
    assert nvme.nqn == "nqn.2014-08.dev:nvme-0"
    assert (cxl.kind, cxl.identity, cxl.capacity_bytes) == ("cxlmem", CXL_SERIAL, 64 << 30)
    assert (cxl.model, cxl.vendor_id, cxl.device_id) == ("cxl-0 model", 0x144D, 0x0C00)
    # Null Health is no error: read as OK.
    assert {d.health for d in inv.devices} == {"OK"}
    assert all(d.adapters == (adapter,) for d in inv.devices)


def test_the_client_reads_no_oem_property() -> None:
    sources = (REPO / "driver" / "fabricclient").glob("*.py")
    # A read names the property as a string: alias="Oem", body["Oem"], .get("Oem").
    reads = {p.name: len(re.findall(r"[\"']Oem[\"'.]", p.read_text())) for p in sorted(sources)}
    assert {name for name, n in reads.items() if n} == set(), reads


def test_mockups_are_where_ci_puts_them() -> None:
    assert (Path(REPO) / ".." / "shared" / "redfish" / "mockups" / "public-cxl").is_dir()


def test_cxl_serial_is_written_as_the_node_side_writes_it() -> None:
    # driver.cxl.serial owns the form; the client sits below it (layers) and
    # writes it itself, so this keeps the two from drifting apart.
    from driver.cxl.serial import cxl_identity
    from driver.fabricclient.identity import cxl_serial

    for gcxlid in ("4C-1D-96-FF-FE-DD-D8-35:0001", "00-00-00-00-00-00-00-2A:0000"):
        assert cxl_serial(gcxlid) == cxl_identity(gcxlid)
