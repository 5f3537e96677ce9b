"""The metrics: what the registries export, what the dashboard and alerts
read, the docs table, and the call sites that feed each metric.

The exported names come from the registries themselves (``driver.metrics``),
never from a list kept here, so a renamed or dropped metric fails the
dashboard, alert and docs checks at once.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.controller import claims as cl
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.pool.states import device_states
from driver.controller.pool.variant import Variant
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device, DeviceTaint
from driver.errors import HotplugError, NvmlError
from driver.fabricclient.memory import MemoryFabric
from driver.fabricclient.model import FabricConnection, FabricDevice, FabricInventory
from driver.health.monitor import HealthMonitor
from driver.kube.api import slice_path
from driver.kube.memory import MemoryKube
from driver.metrics import CONTROLLER, PLUGIN, Sampled, series_names
from driver.node import hotplug
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices.build import PoolSpec
from driver.slices.publisher import SlicePublisher
from plugin.device_metrics import DeviceCounts
from tests import monitoring
from tests.claims_doubles import NODE, FlakyHandler, Reader

REPO = Path(__file__).resolve().parents[2]
TAINT = DeviceTaint("patchbay.dev/unhealthy", "xid-48", "NoSchedule", "2026-11-30T07:00:00Z")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_every_metric_is_prefixed_and_typed() -> None:
    for registry in (PLUGIN, CONTROLLER):
        for family in registry.collect():
            if family.name.startswith("process_"):
                continue  # the library's process collector, standard names
            assert family.name.startswith("patchbay_"), family.name
            assert family.documentation, family.name


@pytest.mark.parametrize("panel", sorted(monitoring.dashboard_queries()))
def test_every_dashboard_query_names_exported_metrics(panel: str) -> None:
    queries = monitoring.dashboard_queries()[panel]
    assert queries, f"panel {panel!r} has no query"
    exported = monitoring.exported("plugin") | monitoring.exported("controller")
    for expr in queries:
        names = monitoring.metric_names(expr)
        assert names, f"{panel}: no metric in {expr!r}"
        assert names <= exported, f"{panel}: {sorted(names - exported)} not exported"


@pytest.mark.parametrize("alert", sorted(monitoring.alert_expressions()))
def test_every_alert_expression_names_exported_metrics(alert: str) -> None:
    expr = monitoring.alert_expressions()[alert]
    names = monitoring.metric_names(expr) - monitoring.SCRAPE_SERIES
    exported = monitoring.exported("plugin") | monitoring.exported("controller")
    assert names, f"{alert}: no metric of ours in {expr!r}"
    assert names <= exported, f"{alert}: {sorted(names - exported)} not exported"


def test_promql_reading_finds_the_metrics_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, op) (rate(a_bucket{x="y{z}"}[5m])))'
        " / on (pod) group_left b_total or vector(0) > bool 2"
    )
    assert monitoring.metric_names(expr) == {"a_bucket", "b_total"}


def test_docs_table_lists_exactly_the_exported_metrics() -> None:
    text = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(patchbay_\w+)`", text, re.M))
    families = {
        f.name + ("_total" if f.type == "counter" else "")
        for registry in (PLUGIN, CONTROLLER)
        for f in registry.collect()
        if f.name.startswith("patchbay_")
    }
    assert documented == families
    for alert in monitoring.alert_expressions():
        assert f"`{alert}`" in text, f"docs/metrics.md does not explain {alert}"


def test_exposition_parses_and_names_match_series_names() -> None:
    text = generate_latest(PLUGIN).decode()
    families = [(f.name, f.type) for f in text_string_to_metric_families(text)]
    assert monitoring.served_names(families) == series_names(PLUGIN)
    assert "patchbay_resourceslice_writes_total" in series_names(CONTROLLER)
    assert "patchbay_prepare_duration_seconds_bucket" not in series_names(CONTROLLER)


async def test_prepare_and_unprepare_are_timed(tmp_path: Path) -> None:
    inv = NodeInventory()
    inv.replace_pool(NODE, [Device(name="gpu-0", kind="gpu", local_id="GPU-0")])
    reader = Reader()
    prep = ClaimPreparer(
        reader, inv, {"gpu": FlakyHandler(tmp_path / "dev")},
        CheckpointStore(tmp_path / "cp.json", "boot"), CdiRegistry(tmp_path / "cdi"),
    )  # fmt: skip
    before = {
        m: value(PLUGIN, f"patchbay_{m}_duration_seconds_count") for m in ("prepare", "unprepare")
    }
    ok = value(PLUGIN, "patchbay_prepare_claims_total", result="ok")
    ref = reader.add("c1", ["gpu-0"])
    assert (await prep.prepare([ref]))[ref.uid].error == ""
    assert value(PLUGIN, "patchbay_prepared_claims") == 1
    assert (await prep.unprepare([ref]))[ref.uid] == ""
    for m in ("prepare", "unprepare"):
        assert value(PLUGIN, f"patchbay_{m}_duration_seconds_count") == before[m] + 1
    assert value(PLUGIN, "patchbay_prepare_claims_total", result="ok") == ok + 1
    assert value(PLUGIN, "patchbay_prepared_claims") == 0
    # Buckets from 0.5 ms (the histogram resolves milliseconds) to 10 s.
    for le in ("0.0005", "0.001", "0.002", "10.0"):
        bucket = PLUGIN.get_sample_value("patchbay_prepare_duration_seconds_bucket", {"le": le})
        assert bucket is not None, le


def test_nvml_errors_are_counted_once_where_they_leave_the_backend() -> None:
    machine = FakeMachine()
    machine.add_gpu("GPU-0", "H100-SXM5-80GB", "0000:3b:00.0", mig=True)
    nvml = FakeNvml(machine)
    name = {"call": "init", "code": "DRIVER_NOT_LOADED"}
    before = value(PLUGIN, "patchbay_nvml_errors_total", **name)
    machine.inject_failure("nvmlInitWithFlags", "DRIVER_NOT_LOADED")
    with pytest.raises(NvmlError):
        nvml.init()
    assert value(PLUGIN, "patchbay_nvml_errors_total", **name) == before + 1
    nvml.init()
    assert nvml.gpus()  # a call that succeeds counts nothing
    assert value(PLUGIN, "patchbay_nvml_errors_total", **name) == before + 1
    # create_gpu_instance calls mig_profiles: one failure, counted once, as the outer call.
    outer = {"call": "create_gpu_instance", "code": "UNKNOWN"}
    inner = {"call": "mig_profiles", "code": "UNKNOWN"}
    counts = (
        value(PLUGIN, "patchbay_nvml_errors_total", **outer),
        value(PLUGIN, "patchbay_nvml_errors_total", **inner),
    )
    machine.inject_failure("nvmlDeviceGetGpuInstanceProfileInfoV", "UNKNOWN")
    with pytest.raises(NvmlError):
        nvml.create_gpu_instance("GPU-0", 0, 0)
    assert value(PLUGIN, "patchbay_nvml_errors_total", **outer) == counts[0] + 1
    assert value(PLUGIN, "patchbay_nvml_errors_total", **inner) == counts[1]


class Event:
    def __init__(self, action: str, path: str) -> None:
        self.action, self.device_path = action, path


async def test_hotplug_events_are_counted_by_action() -> None:
    before = value(PLUGIN, "patchbay_hotplug_events_total", action="add")
    rescanned = threading.Event()

    def source() -> Iterator[Event]:
        yield Event("add", "/devices/pci0000:15/0000:16:00.0")
        yield Event("bind", "/devices/pci0000:15/0000:16:00.0")
        rescanned.wait(10)  # then the source ends, which ends the watch

    async def rescan() -> None:
        rescanned.set()

    with pytest.raises(HotplugError, match="ended"):
        await asyncio.wait_for(hotplug.watch(source(), rescan, debounce_s=0.01), 20)
    assert value(PLUGIN, "patchbay_hotplug_events_total", action="add") == before + 1
    assert value(PLUGIN, "patchbay_hotplug_events_total", action="bind") == 0


def test_device_counts_by_health_taint_and_use() -> None:
    gpus = [Device(name=f"gpu-{i}", kind="gpu", local_id=f"GPU-{i}") for i in range(3)]
    vf = Device(name="vf-0", kind="vf", local_id="0000:16:00.2")
    fabric_gpu = Device(name="fgpu", kind="gpu", local_id="GPU-F")
    health = HealthMonitor()
    pools = {"node-a": [*gpus, vf], "fabric": [fabric_gpu]}
    health.set_devices(pools)
    health.report_xid("GPU-1", 48)
    counts = DeviceCounts(pools, "fabric", health, {("gpu", "GPU-0"), ("gpu", "GPU-F")})
    assert dict((tuple(k), v) for k, v in counts.device_samples()) == {
        ("fabric", "gpu", "healthy"): 1, ("fabric", "gpu", "unhealthy"): 0,
        ("local", "gpu", "healthy"): 2, ("local", "gpu", "unhealthy"): 1,
        ("local", "vf", "healthy"): 1, ("local", "vf", "unhealthy"): 0,
    }  # fmt: skip
    assert dict(counts.tainted_samples()) == {
        ("fabric", "gpu"): 0, ("local", "gpu"): 1, ("local", "vf"): 0,
    }  # fmt: skip
    assert dict(counts.prepared_samples()) == {
        ("fabric", "gpu"): 1, ("local", "gpu"): 1, ("local", "vf"): 0,
    }  # fmt: skip


class _Owner:
    def __init__(self, n: float) -> None:
        self.n = n


def test_a_sampled_gauge_sums_its_live_sources_and_drops_the_gone() -> None:
    """Two instances feed one family (a restarted reconciler, two plugins in
    one test process): each counts while it lives, neither replaces the other."""
    gauge = Sampled("patchbay_test_things", "things", ["kind"])
    first, second = _Owner(2), _Owner(3)
    gauge.add_source(first, lambda o: [(("gpu",), o.n)])
    gauge.add_source(second, lambda o: [(("gpu",), o.n), (("vf",), 1.0)])
    assert gauge.samples() == {("gpu",): 5.0, ("vf",): 1.0}
    del second  # gone: it drops out
    assert gauge.samples() == {("gpu",): 2.0}
    del first
    assert gauge.samples() == {}


def _fabric_device(ident: str, **changes: Any) -> FabricDevice:
    fields: dict[str, Any] = dict(
        id=ident, fabric="pcie0", switch="sw0", kind="gpu", model="H100", serial=ident,
        uuid=f"GPU-{ident}", vendor_id=0x10DE, device_id=0x2330, health="OK", available=True,
        in_use=False, adapters=(), connection=None,
    )  # fmt: skip
    fields.update(changes)
    return FabricDevice(**fields)


def test_fabric_device_states() -> None:
    conn = FabricConnection("c", "/c", "a", "node-a", "adapter0", "Attached", "", None)
    broken = FabricConnection("f", "/f", "f", "node-a", "adapter0", "Failed", "", None)
    inventory = FabricInventory(
        (
            _fabric_device("a", connection=conn),
            _fabric_device("f", connection=broken),
            _fabric_device("b"),
            _fabric_device("c"),
            _fabric_device("d", health="Critical"),
            _fabric_device("e", kind="nic", uuid="", available=False),
        ),
        (),
    )
    assert dict(device_states(inventory, {"c"})) == {
        ("gpu", "free"): 1, ("gpu", "attached"): 1, ("gpu", "failed"): 1, ("gpu", "held"): 1,
        ("gpu", "unavailable"): 1, ("nic", "free"): 0, ("nic", "attached"): 0,
        ("nic", "failed"): 0, ("nic", "held"): 0, ("nic", "unavailable"): 1,
    }  # fmt: skip
    assert device_states(None, set()) == []


async def test_a_failed_attach_is_counted_timed_and_leaves_the_queue() -> None:
    device = _fabric_device("gpu-0")
    api, fabric = MemoryKube(), MemoryFabric([device])
    done = asyncio.Event()
    holds = FailedHolds(300.0, lambda: None)
    workers = Workers(
        fabric, ClaimStatusWriter(api, "fabric"), NodeReports(), holds, 60.0, done.set
    )
    labels = {"op": "attach", "result": "failed"}
    before = value(CONTROLLER, "patchbay_fabric_operation_duration_seconds_count", **labels)
    failed = value(CONTROLLER, "patchbay_fabric_operations_total", **labels)
    holds.hold("gpu-0")  # refused at once, without asking the fabric
    variant = Variant("fgpu-1", "gpu-0", "gpu", "GPU-gpu-0", "node-a", "adapter0", "pci0000:15")
    alloc = cl.FabricAllocation("uid-1", "default", "claim", "fgpu-1", False, False)
    workers.attach(alloc, variant)
    assert value(CONTROLLER, "patchbay_fabric_operations_in_flight", op="attach") == 1
    await asyncio.wait_for(done.wait(), 10)
    assert value(CONTROLLER, "patchbay_fabric_operations_in_flight", op="attach") == 0
    assert value(CONTROLLER, "patchbay_fabric_operations_total", **labels) == failed + 1
    count = "patchbay_fabric_operation_duration_seconds_count"
    assert value(CONTROLLER, count, **labels) == before + 1


async def _publish_until(api: MemoryKube, done: Callable[[], bool]) -> None:
    publisher = SlicePublisher(api, {}, "node-a")
    device = Device("gpu-0", "gpu", "GPU-0", taints=(TAINT,))
    publisher.set_pool(
        PoolSpec("patchbay.dev", "node-a", "node-a-patchbay", {"nodeName": "node-a"}, (device,))
    )
    task = asyncio.create_task(publisher.run())
    try:
        for _ in range(200):
            if done():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the publisher never got there")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_slice_writes_and_publish_failures_are_counted() -> None:
    api = MemoryKube()
    api.fail("POST", slice_path(), 500)  # the first create fails, the retry succeeds
    failures = value(PLUGIN, "patchbay_resourceslice_publish_failures_total", reason="api")
    created = value(CONTROLLER, "patchbay_resourceslice_writes_total", op="create")
    await _publish_until(api, lambda: api.writes == 1)
    assert value(PLUGIN, "patchbay_resourceslice_publish_failures_total", reason="api") == (
        failures + 1
    )
    # One metric for both processes: each registry serves it.
    assert value(CONTROLLER, "patchbay_resourceslice_writes_total", op="create") == created + 1

    dropping = MemoryKube()  # stores slices without their devices' taints: never in sync

    def drop_taints(path: str, obj: dict[str, Any]) -> None:
        for d in obj.get("spec", {}).get("devices") or ():
            d.pop("taints", None)

    dropping.on_store = drop_taints
    diverged = value(PLUGIN, "patchbay_resourceslice_publish_failures_total", reason="diverged")
    name = "patchbay_resourceslice_publish_failures_total"
    await _publish_until(dropping, lambda: value(PLUGIN, name, reason="diverged") > diverged)
