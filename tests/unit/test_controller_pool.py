"""The fabric pool the controller publishes, and the names both sides share."""

from __future__ import annotations

from typing import Literal

from driver.controller.pool import build_pool
from driver.fabric_devices.naming import NodeFabric, counter_name, variant_name
from driver.fabricclient.model import FabricDevice, FabricInventory, HostAdapter
from driver.slices.build import build_slices

Health = Literal["OK", "Warning", "Critical"]


def gpu(ident: str, nodes: tuple[str, ...], health: Health = "OK") -> FabricDevice:
    adapters = tuple(HostAdapter(f"{n}-a0", "pcie0", "sw0", n, "adapter0") for n in nodes)
    return FabricDevice(
        ident, "pcie0", "sw0", "gpu", "H100-SXM5-80GB", "S1", f"GPU-{ident}", 0x10DE, 0x2330,
        health, True, False, adapters, None,
    )  # fmt: skip


REPORTS = {"node-a": NodeFabric({"adapter0": "pci0000:15"}), "node-b": NodeFabric({})}


def test_one_variant_per_reported_adapter_with_its_root_and_a_unique_counter() -> None:
    inv = FabricInventory((gpu("gpu-0", ("node-a", "node-b")), gpu("gpu-1", ("node-a",))), ())
    spec, variants = build_pool("fabric", inv, REPORTS, (), ())
    # node-b did not report adapter0's root: no variant there.
    assert {(v.device_id, v.node) for v in variants.values()} == {
        ("gpu-0", "node-a"),
        ("gpu-1", "node-a"),
    }
    d = spec.devices[0].to_json()
    assert d["nodeName"] == "node-a" and d["bindsToNode"] is True
    assert d["bindingConditions"] == ["FabricDeviceReady"]
    assert d["bindingFailureConditions"] == ["FabricAttachFailed"]
    assert d["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}
    assert d["attributes"]["attachment"] == {"string": "fabric"}
    assert d["consumesCounters"] == [
        {"counterSet": "fabric-devices-0", "counters": {"gpu-0": {"value": "1"}}}
    ]
    slices = build_slices(spec)
    assert all(s.spec["perDeviceNodeSelection"] is True for s in slices)
    assert not any("nodeName" in s.spec for s in slices)
    assert [s.spec.get("sharedCounters") is not None for s in slices] == [True, False]


def test_failed_devices_leave_entirely_unhealthy_ones_keep_only_allocated_variants() -> None:
    inv = FabricInventory((gpu("gpu-0", ("node-a",)), gpu("gpu-1", ("node-a",), "Critical")), ())
    pinned = {variant_name("GPU-gpu-1", "node-a", "adapter0")}
    spec, _ = build_pool("fabric", inv, REPORTS, {"gpu-0"}, pinned)
    assert [d.name for d in spec.devices] == sorted(pinned)
    spec, _ = build_pool("fabric", inv, REPORTS, (), ())
    assert [d.attributes["fabricDevice"] for d in spec.devices] == ["gpu-0"]
    # Counter sets do not depend on health or failures (consumption never moves).
    assert len(spec.counter_sets[0].counters) == 2


def test_counter_sets_hold_at_most_32_counters() -> None:
    inv = FabricInventory(tuple(gpu(f"gpu-{i:02d}", ("node-a",)) for i in range(70)), ())
    spec, _ = build_pool("fabric", inv, REPORTS, (), ())
    assert [len(s.counters) for s in spec.counter_sets] == [32, 32, 6]
    assert len(build_slices(spec)) == 1 + 2  # one counter-set slice, 70 devices in 64+6


def test_names_are_dns_labels_even_for_long_node_names() -> None:
    long = "n" * 60
    name = variant_name("GPU-1", long, "adapter0")
    assert len(name) <= 63 and name.startswith("fgpu-")
    assert name != variant_name("GPU-1", long, "adapter1")
    assert variant_name("GPU-1", "node-a", "adapter0") == variant_name(
        "GPU-1", "node-a", "adapter0"
    )
    assert counter_name("GPU_Weird.Name") != "GPU_Weird.Name"


def test_node_report_round_trips_and_tolerates_garbage() -> None:
    report = NodeFabric({"adapter0": "pci0000:15"}, {"GPU-1": "adapter0"})
    node = {"metadata": {"annotations": {"patchbay.dev/fabric": report.to_annotation()}}}
    assert NodeFabric.from_node(node) == report
    assert NodeFabric.from_node({"metadata": {"annotations": {"patchbay.dev/fabric": "{"}}}) is None
    assert NodeFabric.from_node({"metadata": {}}) is None
