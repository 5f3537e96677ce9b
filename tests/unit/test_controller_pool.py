"""The fabric pool the controller publishes, and the names both sides share."""

from __future__ import annotations

from typing import Literal

from driver.controller.pool.devices import build_pool
from driver.controller.pool.states import published_devices
from driver.controller.pool.variant import Variant
from driver.devices.model import Device
from driver.devices.quantity import of_bytes
from driver.fabric_devices.naming import FAILED_CONDITION, NodeFabric, counter_name, variant_name
from driver.fabricclient.model import FabricDevice, FabricInventory, HostAdapter
from driver.slices.build import build_slices, slice_object
from tests.unit.fabric_objects import reachable_gpu as gpu

Health = Literal["OK", "Warning", "Critical"]


def nic(ident: str, nodes: tuple[str, ...], mac: str = "02:00:00:00:00:01") -> FabricDevice:
    adapters = tuple(HostAdapter(f"{n}-a0", "pcie0", "sw0", n, "adapter0") for n in nodes)
    return FabricDevice(
        ident, "pcie0", "sw0", "nic", "ConnectX-6 Dx", "S2", "", 0x15B3, 0x101D,
        "OK", True, False, adapters, None, mac,
    )  # fmt: skip


def many(n: int, nodes: int) -> FabricInventory:
    names = tuple(f"node-{i:02d}" for i in range(nodes))
    return FabricInventory(tuple(gpu(f"gpu-{i:02d}", names) for i in range(n)), ())


def reports_for(nodes: int) -> dict[str, NodeFabric]:
    return {f"node-{i:02d}": NodeFabric({"adapter0": "pci0000:15"}) for i in range(nodes)}


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
    assert d["bindingFailureConditions"] == [FAILED_CONDITION]
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
    assert "nics" not in report.to_annotation()
    with_nic = NodeFabric({"adapter0": "r"}, {}, {"02:00:00:00:00:01": "adapter0"})
    node = {"metadata": {"annotations": {"patchbay.dev/fabric": with_nic.to_annotation()}}}
    back = NodeFabric.from_node(node)
    assert back == with_nic and back.sees("nic", "02:00:00:00:00:01", "adapter0")
    assert not back.sees("gpu", "02:00:00:00:00:01", "adapter0")
    held = NodeFabric({"adapter0": "r"}, {"GPU-1": "adapter0"}, {}, frozenset({"GPU-1"}))
    node = {"metadata": {"annotations": {"patchbay.dev/fabric": held.to_annotation()}}}
    assert NodeFabric.from_node(node) == held
    assert NodeFabric.from_node({"metadata": {"annotations": {"patchbay.dev/fabric": "{"}}}) is None
    assert NodeFabric.from_node({"metadata": {}}) is None


def test_a_fabric_nic_is_offered_as_one_vf_per_adapter_with_its_own_counter() -> None:
    inv = FabricInventory((gpu("gpu-0", ("node-a",)), nic("nic-0", ("node-a", "node-b"))), ())
    spec, variants = build_pool("fabric", inv, REPORTS, (), ())
    (v,) = (v for v in variants.values() if v.kind == "nic")
    assert v.name == variant_name("02:00:00:00:00:01", "node-a", "adapter0", "nic")
    assert v.name.startswith("fnic-") and v.identity == "02:00:00:00:00:01"
    d = next(d for d in spec.devices if d.name == v.name).to_json()
    assert d["attributes"]["type"] == {"string": "vf"}
    assert d["attributes"]["macAddress"] == {"string": "02:00:00:00:00:01"}
    assert d["attributes"]["vendorID"] == {"string": "15b3"}
    assert d["attributes"]["vfIndex"] == {"int": 0}
    assert d["bindingConditions"] == ["FabricDeviceReady"]
    assert d["consumesCounters"][0]["counters"] == {"nic-0": {"value": "1"}}
    # A NIC without a MAC cannot be recognised on the node: not offered.
    spec, variants = build_pool("fabric", FabricInventory((nic("nic-1", ("node-a",), ""),), ()),
                                REPORTS, (), ())  # fmt: skip
    assert variants == {}


def test_each_slice_holds_one_nodes_variants() -> None:
    inv = many(10, 20)
    spec, _ = build_pool("fabric", inv, reports_for(20), (), ())
    slices = [s for s in build_slices(spec) if "devices" in s.spec]
    assert [len(s.spec["devices"]) for s in slices] == [10] * 20
    assert [len({d["nodeName"] for d in s.spec["devices"]}) for s in slices] == [1] * 20
    # A node reaching more than 64 variants is cut, within that node only.
    spec, _ = build_pool("fabric", many(70, 2), reports_for(2), (), ())
    slices = [s for s in build_slices(spec) if "devices" in s.spec]
    assert [len(s.spec["devices"]) for s in slices] == [64, 6, 64, 6]
    assert [{d["nodeName"] for d in s.spec["devices"]} for s in slices] == [
        {"node-00"},
        {"node-00"},
        {"node-01"},
        {"node-01"},
    ]


def test_an_allocated_variant_outlives_its_adapter_and_a_restart() -> None:
    inv = FabricInventory((gpu("gpu-0", ("node-a",)), gpu("gpu-1", ("node-a",))), ())
    spec, _ = build_pool("fabric", inv, REPORTS, (), ())
    name = variant_name("GPU-gpu-1", "node-a", "adapter0")
    stored = [slice_object(spec, s, 1, 2) for s in build_slices(spec)]
    # A restarted controller reads the pool back from the stored slices ...
    published = published_devices(stored)
    assert published[name] == Device.from_json(
        next(d for d in spec.devices if d.name == name).to_json()
    )
    # ... then node-a stops reporting the adapter and gpu-1 leaves the fabric.
    gone = FabricInventory((gpu("gpu-0", ("node-a",)),), ())
    spec2, variants = build_pool("fabric", gone, {"node-a": NodeFabric({})}, (), {name}, published)
    assert [d.name for d in spec2.devices] == [name]
    assert variants[name].device_id == "gpu-1" and variants[name].node == "node-a"
    counters = {c for s in spec2.counter_sets for c, _ in s.counters}
    assert counters == {"gpu-0", "gpu-1"}  # its counter still exists
    (use,) = spec2.devices[0].consumes_counters
    assert use.counter_set == spec2.counter_sets[0].name
    # Deallocated (no longer pinned): it is gone.
    spec3, _ = build_pool("fabric", gone, {"node-a": NodeFabric({})}, (), (), published)
    assert spec3.devices == ()


def test_device_json_round_trips() -> None:
    inv = FabricInventory((gpu("gpu-0", ("node-a",)), nic("nic-0", ("node-a",))), ())
    spec, _ = build_pool("fabric", inv, REPORTS, (), ())
    for d in spec.devices:
        back = Device.from_json(d.to_json(), d.local_id)
        assert back == d


def drive(ident: str, kind: Literal["nvme", "cxlmem"], serial: str, size: int) -> FabricDevice:
    adapters = (HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0"),)
    return FabricDevice(
        ident, "pcie0", "sw0", kind, "PM1735", serial, "", 0x144D, 0xA824,
        "OK", True, False, adapters, None, capacity_bytes=size,
    )  # fmt: skip


def test_nvme_drives_and_cxl_memory_are_offered_as_their_own_types_with_capacity() -> None:
    nvme = drive("nvme-0", "nvme", "S4NVME0", 3_840_755_982_336)
    cxl = drive("cxl-0", "cxlmem", "0x4c1d96fffeddd835", 64 << 30)
    spec, variants = build_pool("fabric", FabricInventory((nvme, cxl), ()), REPORTS, (), ())
    by_type = {d.kind: d for d in spec.devices}
    assert set(by_type) == {"nvme", "cxlmem"}
    assert by_type["nvme"].name == variant_name("S4NVME0", "node-a", "adapter0", "nvme")
    assert by_type["nvme"].capacity == {"capacity": of_bytes(3_840_755_982_336)}
    assert by_type["cxlmem"].capacity == {"capacity": "64Gi"}
    assert by_type["cxlmem"].attributes["mode"] == "devdax"
    for d in spec.devices:  # what the node reports once attached: the serial
        v = variants[d.name]
        assert d.attributes["serial"] == v.identity and d.attributes["fabricDevice"] == v.device_id
    # A published variant reads back as the same variant (a restart's view).
    stored = published_devices([slice_object(spec, s, 1, 1) for s in build_slices(spec)])
    for name, d in stored.items():
        assert Variant.of(d) == variants[name]
