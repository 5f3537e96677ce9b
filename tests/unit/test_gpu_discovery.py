"""GPU discovery: NVML facts plus sysfs placement into publishable devices."""

from __future__ import annotations

import os
from pathlib import Path

from driver.devices.model import Version
from driver.gpu.scan import SysfsTopology, scan_gpus
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices import limits


def add_pci(root: Path, domain_bus: str, bridge: str, bdf: str, numa: int) -> None:
    dev = root / "devices" / f"pci{domain_bus}" / bridge / bdf
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(f"{numa}\n")
    link = root / "bus" / "pci" / "devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(dev, link.parent))


def test_scan_publishes_attributes_and_topology(tmp_path: Path) -> None:
    machine = FakeMachine()
    machine.add_gpu("GPU-aaaa", next(iter(_models())), "0000:3B:00.0")
    machine.add_gpu("GPU-bbbb", next(iter(_models())), "0000:86:00.0")
    add_pci(tmp_path, "0000:3a", "0000:3a:00.0", "0000:3b:00.0", 0)
    # The second GPU has no sysfs entry: published without topology.
    devices = scan_gpus(FakeNvml(machine), SysfsTopology(tmp_path))
    assert [d.name for d in devices] == ["gpu-0", "gpu-1"]
    first = devices[0]
    assert first.kind == "gpu" and first.local_id == "GPU-aaaa"
    attrs = first.attributes
    assert attrs["resource.kubernetes.io/pcieRoot"] == "pci0000:3a"
    assert attrs["resource.kubernetes.io/pciBusID"] == "0000:3b:00.0"
    assert attrs["resource.kubernetes.io/numaNode"] == 0
    assert attrs["driverVersion"] == Version("580.82.7")
    assert isinstance(attrs["cudaComputeCapability"], Version)
    assert attrs["attachment"] == "local"
    assert first.capacity["memory"].endswith("Mi")
    assert limits.device_problems(first) == []
    assert "resource.kubernetes.io/pcieRoot" not in devices[1].attributes


def test_rescan_sees_hot_added_gpu(tmp_path: Path) -> None:
    machine = FakeMachine()
    backend = FakeNvml(machine)
    topo = SysfsTopology(tmp_path)
    machine.add_gpu("GPU-1", next(iter(_models())), "0000:3b:00.0")
    assert len(scan_gpus(backend, topo)) == 1
    machine.add_gpu("GPU-2", next(iter(_models())), "0000:3c:00.0")
    assert [d.local_id for d in scan_gpus(backend, topo)] == ["GPU-1", "GPU-2"]


def _models() -> list[str]:
    from driver.nvml.fake_models import MODELS

    return sorted(MODELS)
