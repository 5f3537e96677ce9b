"""VF discovery on simulated sysfs trees: roots, switches, PF selection, numVfs."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.devices.model import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT
from driver.slices.limits import device_problems
from driver.vf.config import PfPoolConfig, PfSelector
from driver.vf.discovery import device_name, physical_functions, scan_vfs
from driver.vf.kind import VfType
from fabric.simhost.host import SimHost
from fabric.simhost.sysfs_tree import CLASS_NET, PciFunction
from fabric.simhost.topology import Gpu, Nic, RootComplex, RootPort, Switch, Topology

ALL = PfPoolConfig(pfs=[PfSelector(vendorID="15b3")])


def topology() -> Topology:
    switched = Switch(
        "0000:16:00.0",
        (Gpu("0000:18:00.0"), Nic("0000:17:00.0", "ens0f0np0", total_vfs=8, num_vfs=4)),
    )
    return Topology(
        "vf-test",
        (
            RootComplex(0, 0x15, 0, (RootPort("0000:15:01.0", switched),)),
            RootComplex(
                0,
                0x85,
                1,
                (RootPort("0000:85:01.0", Nic("0000:86:00.0", "ens1f0", total_vfs=4, num_vfs=0)),),
            ),
            RootComplex(0, 0xC5, 1, (RootPort("0000:c5:01.0", None),)),
        ),
    )


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    host = SimHost.build(topology(), tmp_path / "node")
    # A network function without SR-IOV (no sriov_totalvfs): never a PF for us.
    port = host.tree.path_of("0000:c5:01.0")
    plain = host.tree.add_function(
        port, PciFunction("0000:c6:00.0", 0x15B3, 0x1017, CLASS_NET, 1, "mlx5_core")
    )
    (plain / "net" / "eno1").mkdir(parents=True)
    return host


def test_pfs_are_sriov_capable_network_functions(host: SimHost) -> None:
    pfs = {pf.bdf: pf for pf in physical_functions(host.sysfs_root)}
    assert sorted(pfs) == ["0000:17:00.0", "0000:86:00.0"]
    assert pfs["0000:17:00.0"].netdev == "ens0f0np0"
    assert (pfs["0000:17:00.0"].total_vfs, pfs["0000:17:00.0"].num_vfs) == (8, 4)
    assert pfs["0000:86:00.0"].num_vfs == 0


def test_vfs_carry_the_root_of_their_pf_behind_a_switch(host: SimHost) -> None:
    devices = scan_vfs(host.sysfs_root, ALL)
    assert [d.local_id for d in devices] == [f"0000:17:00.{i}" for i in range(2, 6)]
    first = devices[0]
    assert first.name == "vf-0000-17-00-2" and first.kind == "vf"
    attrs = first.attributes
    assert attrs[PCIE_ROOT] == "pci0000:15"  # not "pci0000:17": never from the bus id
    assert attrs[PCI_BUS_ID] == "0000:17:00.2"
    assert attrs[NUMA_NODE] == 0
    assert attrs["pfName"] == "ens0f0np0" and attrs["pfPciBusID"] == "0000:17:00.0"
    assert [d.attributes["vfIndex"] for d in devices] == [0, 1, 2, 3]
    assert (attrs["vendorID"], attrs["deviceID"]) == ("15b3", "101e")
    assert attrs["linkType"] == "ethernet"
    for d in devices:
        assert device_problems(d) == []


def test_infiniband_link_type_is_read_from_the_netdev(host: SimHost) -> None:
    netdev = host.tree.path_of("0000:17:00.0") / "net" / "ens0f0np0"
    (netdev / "type").write_text("32\n")
    assert {d.attributes["linkType"] for d in scan_vfs(host.sysfs_root, ALL)} == {"infiniband"}


@pytest.mark.parametrize(
    ("selector", "pfs"),
    [
        ({"name": "ens0f0np0"}, ["0000:17:00.0"]),
        ({"pciAddress": "0000:86:00.0"}, []),  # selected, but its VFs are disabled
        ({"vendorID": "0x15B3", "deviceID": "101d"}, ["0000:17:00.0"]),
        ({"vendorID": "8086"}, []),
        ({"name": "eno1"}, []),  # no SR-IOV: never offered
    ],
)
def test_selectors_pick_pfs(host: SimHost, selector: dict[str, str], pfs: list[str]) -> None:
    config = PfPoolConfig.model_validate({"pfs": [selector]})
    found = {str(d.attributes["pfPciBusID"]) for d in scan_vfs(host.sysfs_root, config)}
    assert sorted(found) == pfs


def test_nothing_is_offered_without_a_selector(host: SimHost) -> None:
    vf_type = VfType(PfPoolConfig(), host.sysfs_root, host.dir / "dev")
    assert vf_type.discover().devices == ()


def test_num_vfs_creates_and_shrinks_through_zero(host: SimHost) -> None:
    config = PfPoolConfig.model_validate(
        {"pfs": [{"name": "ens1f0", "numVfs": 3}, {"name": "ens0f0np0", "numVfs": 2}]}
    )
    vf_type = VfType(config, host.sysfs_root, host.dir / "dev")
    with host.effects_watcher():
        found = vf_type.discover().devices
        by_pf: dict[object, list[str]] = {}
        for d in found:
            by_pf.setdefault(d.attributes["pfName"], []).append(d.local_id)
        assert by_pf == {
            "ens0f0np0": ["0000:17:00.2", "0000:17:00.3"],
            "ens1f0": ["0000:86:00.2", "0000:86:00.3", "0000:86:00.4"],
        }
        assert not host.tree.exists("0000:17:00.4")
        new_vf = host.tree.path_of("0000:86:00.4")
        assert (new_vf / "net" / "ens1f0v2").is_dir()
        assert host.tree.driver_of("0000:86:00.4") == "mlx5_core"
        assert {d.attributes[PCIE_ROOT] for d in found if d.attributes["pfName"] == "ens1f0"} == {
            "pci0000:85"
        }
        # A second scan finds everything in place and writes nothing.
        control = host.tree.path_of("0000:17:00.0") / "sriov_numvfs"
        before = control.stat().st_mtime_ns
        assert vf_type.configure_pfs() == 0
        assert control.stat().st_mtime_ns == before


def test_num_vfs_above_total_is_refused_and_logged(
    host: SimHost, caplog: pytest.LogCaptureFixture
) -> None:
    config = PfPoolConfig.model_validate({"pfs": [{"name": "ens1f0", "numVfs": 9}]})
    vf_type = VfType(config, host.sysfs_root, host.dir / "dev")
    assert vf_type.discover().devices == ()
    assert "exceeds sriov_totalvfs 4" in caplog.text


def test_device_names_are_dns_labels() -> None:
    assert device_name("0000:AF:1f.7") == "vf-0000-af-1f-7"
