"""The simulated host's sysfs tree: topology as the kernel would show it."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.pci import sysfs
from driver.pci.writes import write_command
from fabric.simhost import TOPOLOGIES, SimHost
from fabric.simhost.topology import Nic, TopologySpec
from tests.harness import poll


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path / "node")


def test_pcie_root_is_the_first_element_under_devices(host: SimHost) -> None:
    root = host.sysfs_root
    # GPUs sit behind a switch on bus 0x18/0x19, yet their root complex is pci0000:15
    assert sysfs.pcie_root(root, "0000:18:00.0") == "pci0000:15"
    assert sysfs.pcie_root(root, "0000:19:00.0") == "pci0000:15"
    assert sysfs.pcie_root(root, "0000:88:00.0") == "pci0000:85"
    assert sysfs.numa_node(root, "0000:18:00.0") == 0
    assert sysfs.numa_node(root, "0000:88:00.0") == 1
    link = root / "bus" / "pci" / "devices" / "0000:18:00.0"
    assert str(link.readlink()).startswith("../../../devices/pci0000:15/")
    with pytest.raises(FileNotFoundError):
        sysfs.pcie_root(root, "0000:99:00.0")
    with pytest.raises(ValueError):
        sysfs.pcie_root(root, "not-a-bdf")


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_every_gpu_in_nvml_state_has_a_device_under_its_root(name: str, tmp_path: Path) -> None:
    topology = TOPOLOGIES[name]()
    host = SimHost.build(topology, tmp_path / name)
    roots = {rc.name for rc in topology.roots}
    uuids = host.gpu_uuids()
    for bdf in uuids:
        assert sysfs.pcie_root(host.sysfs_root, bdf) in roots
        assert (host.tree.path_of(bdf) / "vendor").read_text().strip() == "0x10de"
        assert host.tree.driver_of(bdf) == "nvidia"
    assert len(set(uuids.values())) == len(uuids)
    expected = {"2x-h100-nic": 4, "8x-a100": 8, "fabric-adapters": 0, "4x-h100": 4, "2-gpus": 2}
    expected["numa-shared-nic"] = 4
    expected["gpu-nvme"] = 4
    expected["local-gpu-fabric"] = 1
    assert len(uuids) == expected[name]


def test_vf_and_pf_links_are_consistent(host: SimHost) -> None:
    root = host.sysfs_root
    pf = host.tree.path_of("0000:1a:00.0")
    assert (pf / "class").read_text().strip() == "0x020000"
    assert (pf / "sriov_totalvfs").read_text().strip() == "8"
    vfs = sorted(pf.glob("virtfn*"), key=lambda p: int(p.name[6:]))
    assert len(vfs) == int((pf / "sriov_numvfs").read_text())
    for i, link in enumerate(vfs):
        vf = link.resolve()
        assert (vf / "physfn").resolve() == pf.resolve()
        assert sysfs.pcie_root(root, vf.name) == "pci0000:15"
        assert sysfs.numa_node(root, vf.name) == 0
        assert (vf / "net" / f"ens0f0np0v{i}").is_dir()
        assert (vf / "device").read_text().strip() == "0x101e"
        group = (vf / "iommu_group").resolve()
        assert (group / "devices" / vf.name).resolve() == vf.resolve()
    names = [link.resolve().name for link in vfs]
    assert names[0] == "0000:1a:00.2" and names[-1] == "0000:1a:01.1"  # offset 2, stride 1
    groups = {(root / "bus/pci/devices" / n / "iommu_group").resolve() for n in names}
    assert len(groups) == len(names)


def test_unbind_override_and_probe_rebind_a_vf(host: SimHost) -> None:
    bdf = "0000:1a:00.3"
    dev = host.sysfs_root / "bus/pci/devices" / bdf
    (dev / "driver_override").write_text("vfio-pci")
    write_command(dev / "driver" / "unbind", bdf)
    assert host.process_writes() == 1
    assert not (dev / "driver").exists()
    write_command(host.sysfs_root / "bus/pci/drivers_probe", bdf)
    assert host.process_writes() == 1
    assert host.tree.driver_of(bdf) == "vfio-pci"
    assert (host.sysfs_root / "bus/pci/drivers/vfio-pci" / bdf).resolve() == dev.resolve()
    # and back: clear the override, unbind, probe -> the native driver
    (dev / "driver_override").write_text("\n")
    write_command(dev / "driver" / "unbind", bdf)
    write_command(host.sysfs_root / "bus/pci/drivers_probe", bdf)
    assert host.process_writes() == 2
    assert host.tree.driver_of(bdf) == "mlx5_core"


def test_every_request_written_is_applied_once(host: SimHost) -> None:
    """Two VFs of one PF unbound side by side (per-device prepare locks let
    two claims do it at once), the same request again after a pass, and a
    write still landing: each write is one request, as on a kernel. Writes
    that truncated the file lost the first of two (issue 36: a burst's VF
    claim timed out waiting for its unbind)."""
    vfs = ["0000:1a:00.3", "0000:1a:00.4"]
    unbind = host.sysfs_root / "bus/pci/drivers/mlx5_core/unbind"
    probe = host.sysfs_root / "bus/pci/drivers_probe"
    assert [host.tree.driver_of(v) for v in vfs] == ["mlx5_core"] * 2
    for vf in vfs:
        write_command(unbind, vf)
    assert host.process_writes() == 2
    assert [host.tree.driver_of(v) for v in vfs] == [None, None]
    for vf in vfs:
        write_command(probe, vf)
    assert host.process_writes() == 2
    write_command(unbind, vfs[0])  # read on from where the last pass stopped
    assert host.process_writes() == 1
    with unbind.open("a") as f:
        f.write(vfs[1][:8])  # not yet a whole BDF: waits for the rest
    assert host.process_writes() == 0
    with unbind.open("a") as f:
        f.write(vfs[1][8:] + "\n")
    assert host.process_writes() == 1
    assert host.process_writes() == 0  # nothing is applied twice
    assert [host.tree.driver_of(v) for v in vfs] == [None, None]


def test_a_gpu_leaves_and_rejoins_nvml_before_its_driver_link_changes(host: SimHost) -> None:
    """The kernel's order: a driver's remove runs before the ``driver`` link
    goes, its probe before the link appears. A writer that waits for the link
    finds NVML in step (issue 33: the GPU was once missing from NVML just
    after the link showed it back on nvidia)."""
    bdf = next(g["pci_bus_id"] for g in host.nvml.read()["gpus"])
    dev = host.sysfs_root / "bus/pci/devices" / bdf
    seen: list[tuple[str | None, str | None]] = []  # (change, the link at that moment)
    on_change = host.effects.on_driver_change
    assert on_change is not None

    def noting(changed: str, driver: str | None) -> None:
        seen.append((driver, host.tree.driver_of(changed)))
        on_change(changed, driver)

    host.effects.on_driver_change = noting
    write_command(dev / "driver" / "unbind", bdf)
    assert host.process_writes() == 1
    assert bdf not in host.gpu_uuids()
    write_command(host.sysfs_root / "bus/pci/drivers_probe", bdf)
    assert host.process_writes() == 1
    assert bdf in host.gpu_uuids()
    assert seen == [(None, "nvidia"), ("nvidia", None)]


def test_bind_honours_override_and_watcher_applies_writes(host: SimHost) -> None:
    bdf = "0000:1a:00.4"
    dev = host.sysfs_root / "bus/pci/devices" / bdf
    host.tree.driver_dir("vfio-pci")
    # No safety pass within the test: only the inotify wake-up can apply the writes.
    with host.effects_watcher(safety_s=3600):
        write_command(dev / "driver" / "unbind", bdf)
        write_command(host.sysfs_root / "bus/pci/drivers/vfio-pci/bind", bdf)
        poll.wait_for(
            "the VF bound to vfio-pci", lambda: host.tree.driver_of(bdf) == "vfio-pci", 30
        )
    assert host.process_writes() == 0  # nothing left pending


def test_watcher_wakes_for_vf_counts_probes_and_drivers_made_after_it_started(
    host: SimHost,
) -> None:
    pf = next(p.parent.name for p in (host.sysfs_root / "bus/pci/devices").glob("*/sriov_numvfs"))
    pf_dir = host.sysfs_root / "bus/pci/devices" / pf
    vfs = lambda: len(list(pf_dir.glob("virtfn*")))  # noqa: E731
    with host.effects_watcher(safety_s=3600):
        (pf_dir / "sriov_numvfs").write_text(str(vfs() + 1))
        want = int((pf_dir / "sriov_numvfs").read_text())
        poll.wait_for("one more VF", lambda: vfs() == want, 30)
        vf = (pf_dir / f"virtfn{want - 1}").resolve().name
        host.tree.driver_dir("late-driver")  # a driver directory that appears later
        (host.sysfs_root / "bus/pci/devices" / vf / "driver_override").write_text("late-driver")
        write_command(host.sysfs_root / "bus/pci/devices" / vf / "driver" / "unbind", vf)
        poll.wait_for("the VF unbound", lambda: host.tree.driver_of(vf) is None, 30)
        write_command(host.sysfs_root / "bus/pci/drivers/late-driver/bind", vf)
        poll.wait_for("the VF bound", lambda: host.tree.driver_of(vf) == "late-driver", 30)


def test_topology_spec_from_yaml_shape(tmp_path: Path) -> None:
    spec = TopologySpec.model_validate(
        {
            "name": "custom",
            "roots": [
                {
                    "bus": 0x40,
                    "numa_node": 1,
                    "ports": [
                        {
                            "bdf": "0000:40:01.0",
                            "child": {
                                "kind": "gpu",
                                "bdf": "0000:41:00.0",
                                "model": "H200-SXM5-141GB",
                            },
                        },
                        {"bdf": "0000:40:02.0", "adapter": "adapter0"},
                    ],
                }
            ],
        }
    )
    host = SimHost.build(spec.to_topology(), tmp_path / "custom")
    assert sysfs.pcie_root(host.sysfs_root, "0000:41:00.0") == "pci0000:40"
    assert sysfs.numa_node(host.sysfs_root, "0000:41:00.0") == 1
    assert host.free_bdf("adapter0") == "0000:42:00.0"  # 0000:41:00.0 is the GPU
    with pytest.raises(ValueError):
        TopologySpec.model_validate({"name": "x", "roots": [{"bus": 1, "ports": [{"bdf": "bad"}]}]})


def test_nic_hot_add_arrives_bare_and_its_vfs_sit_under_the_adapter(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "n")
    added = host.hot_add("adapter1", Nic("0000:86:00.0", "ens9f0", total_vfs=4, num_vfs=2))
    assert added == ["0000:86:00.0"]  # as a real PF: no VFs until the node makes them
    pf = host.tree.path_of("0000:86:00.0")
    assert (pf / "sriov_numvfs").read_text() == "0\n" and not list(pf.glob("virtfn*"))
    (pf / "sriov_numvfs").write_text("2\n")
    host.process_writes()
    bdfs = [*added, "0000:86:00.2", "0000:86:00.3"]
    assert all(host.tree.exists(b) for b in bdfs)
    assert {sysfs.pcie_root(host.sysfs_root, b) for b in bdfs} == {"pci0000:85"}
    assert {sysfs.numa_node(host.sysfs_root, b) for b in bdfs} == {1}


def test_numa_node_minus_one_means_unknown(host: SimHost) -> None:
    (host.tree.path_of("0000:18:00.0") / "numa_node").write_text("-1\n")
    assert sysfs.numa_node(host.sysfs_root, "0000:18:00.0") is None


def test_hot_remove_finishes_what_is_left_of_a_device(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "n")
    (pf,) = host.hot_add("adapter1", Nic("0000:86:00.0", "ens9f0", total_vfs=4))
    (host.tree.path_of(pf) / "sriov_numvfs").write_text("2\n")
    host.process_writes()
    host.tree.remove_function("0000:86:00.3")  # one VF already gone (a half-done remove)
    assert host.hot_remove(pf) == ["0000:86:00.2", pf]
    assert not host.tree.exists(pf)
    assert host.hot_remove(pf) == []  # run again: nothing left, no error
