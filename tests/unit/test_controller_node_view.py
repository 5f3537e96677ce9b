"""The node plugin's split of local and fabric-attached devices (simulated host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.devices.model import PCI_BUS_ID, Device
from driver.errors import ConfigError
from driver.fabric_devices.naming import variant_name
from driver.fabric_devices.node import FabricNodeView, parse_adapters
from driver.pci import sysfs
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import scan_vfs
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu, Nic


def test_gpu_behind_an_adapter_is_fabric_never_local(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path, "node-a")
    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", Gpu(bdf, uuid="GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11"))
    view = FabricNodeView(
        "node-a", parse_adapters("adapter0=0000:15:02.0, adapter1=0000:85:01.0"), host.sysfs_root
    )
    fab = Device("gpu-0", "gpu", "GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11", {PCI_BUS_ID: bdf})
    vf = Device("vf-1", "vf", "0000:16:00.2", {PCI_BUS_ID: "0000:16:00.2"})
    local, attached = view.split([fab, vf])
    assert [d.name for d in local] == ["vf-1"]
    assert [d.name for d in attached] == [
        variant_name("GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11", "node-a", "adapter1")
    ]
    assert attached[0].attributes["attachment"] == "fabric"
    report = view.report(attached)
    assert report.adapters == {"adapter0": "pci0000:15", "adapter1": "pci0000:85"}
    assert report.gpus == {"GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11": "adapter1"}
    assert report.busy == frozenset()
    held = view.report(attached, {("gpu", "GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11")})
    assert held.busy == {"GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11"}


def attached_gpu(tmp_path: Path, uuid: str) -> tuple[SimHost, FabricNodeView, Device]:
    """A host with a GPU the fabric attached behind adapter0, the node's view,
    and the GPU as the scan found it."""
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path, "node-a")
    bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Gpu(bdf, uuid=uuid))
    view = FabricNodeView("node-a", parse_adapters("adapter0=0000:15:02.0"), host.sysfs_root)
    return host, view, Device("gpu-0", "gpu", uuid, {PCI_BUS_ID: bdf})


def test_gpu_gone_from_sysfs_during_the_scan_is_not_offered_as_local(tmp_path: Path) -> None:
    """A detach hot-removes the GPU after the scan found it: seen in a soak as
    two slice rewrites offering the departing fabric GPU as a local one."""
    host, view, scanned = attached_gpu(tmp_path, "GPU-0b7a7f50-8f6e-4f8e-9a43-3b5d2f6c1a22")
    host.hot_remove(str(scanned.attributes[PCI_BUS_ID]))
    assert view.split([scanned]) == ([], [])


def test_gpu_leaving_the_bus_while_it_is_split_is_never_offered_as_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The detach hot-removes the GPU between two looks at sysfs: seen in a
    15-minute soak as a departing fabric GPU published as a free local one,
    which the scheduler then gave a claim the plugin could never prepare."""
    _, view, scanned = attached_gpu(tmp_path, "GPU-4c2d8e1a-9b3f-4d6e-8a7c-1f2e3d4c5b66")
    bdf, uuid = str(scanned.attributes[PCI_BUS_ID]), scanned.local_id
    real = sysfs.device_path
    looks: list[str] = []

    def then_gone(root: Path, address: str) -> Path:
        looks.append(address)
        if address == bdf and looks.count(bdf) > 1:  # removed right after the first look
            raise FileNotFoundError(address)
        return real(root, address)

    monkeypatch.setattr(sysfs, "device_path", then_gone)
    local, attached = view.split([scanned])
    assert local == []
    assert [d.name for d in attached] == [variant_name(uuid, "node-a", "adapter0")]


def test_nic_behind_an_adapter_offers_its_vf0_as_the_fabric_variant(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path, "node-a")
    bdf = host.free_bdf("adapter1")
    mac = "02:aa:bb:cc:dd:ee"
    host.hot_add("adapter1", Nic(bdf, "ens9f0", total_vfs=4, num_vfs=3, mac=mac))
    (host.tree.path_of(bdf) / "sriov_numvfs").write_text("3\n")  # the node's driver
    host.process_writes()
    view = FabricNodeView(
        "node-a", parse_adapters("adapter0=0000:15:02.0, adapter1=0000:85:01.0"), host.sysfs_root
    )
    # The local PF is not selected by the (empty) PF config; the fabric one always is.
    vfs = scan_vfs(host.sysfs_root, PfPoolConfig(), view.behind_adapter)
    assert len(vfs) == 3 and all(v.attributes["pfPciBusID"] == bdf for v in vfs)
    local, attached = view.split(vfs)
    assert local == []
    (vf0,) = attached
    assert vf0.name == variant_name(mac, "node-a", "adapter1", "nic")
    assert vf0.kind == "vf" and vf0.attributes["vfIndex"] == 0
    assert vf0.attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:85"
    report = view.report(attached, {("vf", vf0.local_id)})
    assert report.nics == {mac: "adapter1"} and report.gpus == {}
    assert report.busy == {mac}  # a held VF marks its NIC busy by the NIC's identity


def test_adapter_setting_must_name_ports() -> None:
    with pytest.raises(ConfigError):
        parse_adapters("adapter0")
    assert parse_adapters("") == {}
