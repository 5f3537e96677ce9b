"""The plugin leaves a PF alone until its add has been processed (issue 33).

A rescan that another device's hot-plug event triggered lists every PF on
the bus, also one whose own ``add`` the plugin has not processed yet; it
used to set such a PF's VF count at once, through zero, while the fabric
was still adding it.
"""

from __future__ import annotations

from pathlib import Path

from driver.pci.arrivals import Arrivals
from driver.vf.config import PfPoolConfig, PfSelector
from driver.vf.discovery import physical_functions, virtual_functions
from driver.vf.kind import VfType
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Nic

FOUR = PfPoolConfig(pfs=[PfSelector(vendorID="15b3", numVfs=4)])
FABRIC_NIC = "0000:86:00.0"


def _behind_adapter1(bdf: str) -> bool:
    return bdf.startswith("0000:86:")


def _vf_count(host: SimHost, bdf: str) -> int:
    (pf,) = (p for p in physical_functions(host.sysfs_root) if p.bdf == bdf)
    return len(virtual_functions(pf))


def test_a_pf_whose_add_was_not_processed_keeps_its_vf_count(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "node")
    arrivals = Arrivals()
    vfs = VfType(FOUR, host.sysfs_root, tmp_path / "dev", _behind_adapter1, arrivals)
    with host.effects_watcher():
        vfs.discover()  # the first scan: what is there has arrived
        host.hot_add("adapter1", Nic(FABRIC_NIC, "fab0f0", total_vfs=4))
        # A rescan (another device's event) finds the new PF: listed, not changed.
        assert FABRIC_NIC in {p.bdf for p in physical_functions(host.sysfs_root)}
        assert vfs.configure_pfs() == 0
        assert _vf_count(host, FABRIC_NIC) == 0
        arrivals.note("add", FABRIC_NIC)  # the hot-plug watch processed its add
        assert vfs.configure_pfs() == 1
        assert _vf_count(host, FABRIC_NIC) == 4
        arrivals.note("remove", FABRIC_NIC)
        assert not arrivals.settled([FABRIC_NIC])


def test_present_at_the_first_scan_is_settled_and_events_before_it_count() -> None:
    arrivals = Arrivals()
    arrivals.note("add", "0000:87:00.0")  # the source is opened before the first scan
    assert arrivals.settled(["0000:17:00.0", "0000:87:00.0"]) == {"0000:17:00.0", "0000:87:00.0"}
    assert arrivals.settled(["0000:17:00.0", "0000:88:00.0"]) == {"0000:17:00.0"}
    assert Arrivals(tracking=False).settled(["0000:88:00.0"]) == {"0000:88:00.0"}


def test_a_fabric_nic_without_a_selector_gets_the_one_vf_its_claim_uses(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "node")
    vfs = VfType(PfPoolConfig(), host.sysfs_root, tmp_path / "dev", _behind_adapter1)
    host.hot_add("adapter1", Nic(FABRIC_NIC, "fab0f0", total_vfs=4))
    with host.effects_watcher():
        found = vfs.discover()
    assert _vf_count(host, FABRIC_NIC) == 1
    assert [d.attributes["pfPciBusID"] for d in found.devices] == [FABRIC_NIC]
