"""The node plugin's split of local and fabric-attached devices (simulated host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.devices.model import PCI_BUS_ID, Device
from driver.errors import ConfigError
from driver.fabric_devices.naming import variant_name
from driver.fabric_devices.node import FabricNodeView, parse_adapters
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu


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


def test_adapter_setting_must_name_ports() -> None:
    with pytest.raises(ConfigError):
        parse_adapters("adapter0")
    assert parse_adapters("") == {}
