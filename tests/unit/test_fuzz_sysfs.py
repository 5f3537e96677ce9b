"""Fuzzed sysfs contents: the attribute files a PF and a VF scan reads hold
odd shapes (empty, binary, not UTF-8, signs, Unicode digits, a directory in
place of a file), on a simulated host's tree. The property: the scans never
raise; a device is offered with well-formed attributes or left out (GPU
placement: the attribute is omitted), and the files of the other PF still
give their VFs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.devices.model import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT
from driver.gpu.scan import SysfsTopology
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import physical_functions, scan_vfs
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.fuzzing import CONTENTS, FUZZ, Files

CONFIG = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PF_FILES = [
    "class",
    "vendor",
    "device",
    "sriov_totalvfs",
    "sriov_numvfs",
    "numa_node",
    "net/*/type",
]
VF_FILES = ["vendor", "device", "numa_node"]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> SimHost:
    return SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path_factory.mktemp("fuzz") / "node")


def target(root: Path, name: str) -> Path:
    if name == "net/*/type":  # the simulated tree has no type file: ethernet
        (netdev,) = (root / "net").iterdir()
        return netdev / "type"
    return root / name


@settings(FUZZ, max_examples=60)  # two sysfs scans per example
@given(
    st.dictionaries(st.sampled_from(PF_FILES), CONTENTS, max_size=3),
    st.dictionaries(st.sampled_from(VF_FILES), CONTENTS, max_size=2),
)
def test_vf_scan_offers_well_formed_devices_or_leaves_them_out(
    host: SimHost, pf_files: dict[str, bytes | None], vf_files: dict[str, bytes | None]
) -> None:
    first, second = physical_functions(host.sysfs_root)
    vf_path = host.tree.path_of("0000:1a:00.2")
    changes = Files()
    try:
        for name, content in pf_files.items():
            changes.put(target(first.path, name), content)
        for name, content in vf_files.items():
            changes.put(vf_path / name, content)
        devices = scan_vfs(host.sysfs_root, CONFIG)
        topology = SysfsTopology(host.sysfs_root)
        numa = topology.numa_node("0000:1a:00.2")
        root = topology.pcie_root("0000:1a:00.2")
    finally:
        changes.restore()
    assert numa is None or (isinstance(numa, int) and numa >= 0)
    assert root is None or root.startswith("pci")
    for device in devices:
        attrs = device.attributes
        assert BDF.match(str(attrs[PCI_BUS_ID])) and isinstance(attrs["vfIndex"], int)
        assert re.fullmatch(r"[0-9a-f]{4}", str(attrs["vendorID"])), attrs
        assert re.fullmatch(r"[0-9a-f]{4}", str(attrs["deviceID"])), attrs
        assert str(attrs[PCIE_ROOT]).startswith("pci")
        numa_attr = attrs.get(NUMA_NODE)
        assert numa_attr is None or (isinstance(numa_attr, int) and numa_attr >= 0)
    others = [d for d in devices if d.attributes["pfPciBusID"] == second.bdf]
    assert len(others) == second.num_vfs, "the untouched PF's VFs are all offered"
