"""Hot-plug on a simulated host: uevents in order, NVML state in step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from driver.pci import sysfs
from driver.pci.uevents import UeventFeed
from fabric.simhost import TOPOLOGIES, SimHost
from fabric.simhost.topology import Gpu, Nic

REPO = Path(__file__).resolve().parents[2]


def test_hot_add_and_remove_emit_kernel_shaped_events_in_order(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "node")
    feed = UeventFeed(host.uevent_path, sysfs_root=str(host.sysfs_root))
    assert feed.read_new() == []

    gpu_bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Gpu(gpu_bdf, "H100-SXM5-80GB"))
    nic = host.hot_add("adapter1", Nic("0000:86:00.0", "ens9f0", total_vfs=2, num_vfs=2))
    assert nic == ["0000:86:00.0"]  # a PF arrives with no VFs
    (host.tree.path_of(nic[0]) / "sriov_numvfs").write_text("2\n")  # the node's driver
    host.process_writes()  # VFs made through sriov_numvfs have no uevent of their own
    vfs = ["0000:86:00.2", "0000:86:00.3"]
    host.hot_remove("0000:86:00.0")
    host.hot_remove(gpu_bdf)

    events = feed.read_new()
    assert [(e.action, e.slot_name) for e in events] == [
        ("add", gpu_bdf),
        ("add", nic[0]),
        ("remove", vfs[0]),
        ("remove", vfs[1]),
        ("remove", nic[0]),
        ("remove", gpu_bdf),
    ]
    assert [e.sequence_number for e in events] == list(range(1, 7))
    first = events[0]
    assert first.subsystem == "pci"
    assert first.get("PCI_ID") == "10DE:2330"
    assert first.get("PCI_CLASS") == "30200"
    assert first.device_path == f"/devices/pci0000:15/0000:15:02.0/{gpu_bdf}"
    assert first.sys_path == f"{host.sysfs_root}{first.device_path}"
    assert events[1].get("PCI_CLASS") == "20000"
    assert feed.read_new() == []  # nothing twice


def test_nvml_state_follows_hot_plug(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "node")
    bdf = host.free_bdf("adapter0")
    host.hot_add("adapter0", Gpu(bdf, "A100-SXM4-80GB"))
    assert sysfs.pcie_root(host.sysfs_root, bdf) == "pci0000:15"
    state = host.nvml.read()
    assert [(g["pci_bus_id"], g["model"], g["minor"]) for g in state["gpus"]] == [
        (bdf, "A100-SXM4-80GB", 0)
    ]
    host.hot_remove(bdf)
    assert host.nvml.read()["gpus"] == []
    assert not (host.sysfs_root / "bus/pci/devices" / bdf).exists()


def test_feed_reader_waits_for_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "uevents.jsonl"
    line = json.dumps({"ACTION": "add", "SUBSYSTEM": "pci", "PCI_SLOT_NAME": "0000:01:00.0"})
    path.write_text(line[:10])
    feed = UeventFeed(path)
    assert feed.read_new() == []
    with open(path, "a") as f:
        f.write(line[10:] + "\n")
    assert [e.slot_name for e in feed.read_new()] == ["0000:01:00.0"]


def test_cli_builds_a_host_and_hot_adds(tmp_path: Path) -> None:
    node = tmp_path / "cli"
    run = [sys.executable, "-m", "fabric.simhost"]
    out = subprocess.run(
        [*run, "build", "--topology", "fabric-adapters", "--dir", str(node)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    info = json.loads(out.stdout)
    assert Path(info["PATCHBAY_NVML_STATE"]).exists()
    out = subprocess.run(
        [*run, "hot-add", "--dir", str(node), "--adapter", "adapter1", "--gpu", "H200-SXM5-141GB"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    (bdf,) = json.loads(out.stdout)
    assert sysfs.pcie_root(Path(info["sysfs_root"]), bdf) == "pci0000:85"
    assert [e.action for e in UeventFeed(Path(info["uevents"])).read_new()] == ["add"]
