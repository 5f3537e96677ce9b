"""A fabric GPU on a node: never offered in the node's own pool (whole, as MIG
placements or as shares), and busy in the node's report while anything uses
it (issue 34, "fabric GPUs are offered twice, and a GPU in use can be
detached")."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Mapping
from pathlib import Path

from driver.checkpoint import Checkpoint
from driver.devices.model import Device, drawn_on
from driver.fabric_devices.node import FabricNodeView, parse_adapters
from driver.fabric_devices.usage import FabricUsage, nvml_probe
from driver.gpu.fraction import SharePolicy
from driver.gpu.kind import GpuType
from driver.gpu.usage import gpus_in_use
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from fabric.simhost import violations
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu

FABRIC_GPU = "GPU-5e0b1c2d-3f4a-4b5c-8d6e-7f8091a2b3c4"
ADAPTERS = "adapter0=0000:15:02.0,adapter1=0000:85:02.0"  # the gpu-nvme board's


def node_with_a_fabric_gpu(tmp: Path) -> tuple[SimHost, FakeMachine, GpuType, FabricNodeView]:
    """The GPUDirect board (4 local H100s, an adapter on each root) with one H100
    the fabric attached behind adapter0; NVML (the fake) sees all five, dynamic
    MIG and sharing on for every GPU, as on the demo's nodes."""
    host = SimHost.build(TOPOLOGIES["gpu-nvme"](), tmp / "host", "node-c")
    host.hot_add("adapter0", Gpu(host.free_bdf("adapter0"), uuid=FABRIC_GPU))
    machine = FakeMachine()
    for g in host.nvml.read()["gpus"]:
        machine.add_gpu(g["uuid"], g["model"], g["pci_bus_id"], serial=g["serial"])
    nvml = FakeNvml(machine)
    mig = MigSupport(
        NvmlSession(nvml),
        MigPolicy.parse("all", "", True, False),
        lambda s, g: MigHandler(s, g, tmp / "dev"),
        Checkpoint,
    )
    share = SharePolicy.parse("all", 1024)
    gpus = GpuType(nvml, host.sysfs_root, tmp / "dev", mig=mig, events=nvml, share=share)
    return host, machine, gpus, FabricNodeView("node-c", parse_adapters(ADAPTERS), host.sysfs_root)


def of_gpu(d: Device, uuid: str) -> bool:
    return uuid in (d.local_id, d.parent)


def test_a_fabric_gpu_is_offered_in_no_part_in_the_nodes_own_pool(tmp_path: Path) -> None:
    _, _, gpus, view = node_with_a_fabric_gpu(tmp_path)
    found = gpus.discover()
    scanned = list(found.devices)
    assert {d.kind for d in scanned if of_gpu(d, FABRIC_GPU)} == {"gpu", "mig", "shared-gpu"}
    local, fabric = view.split(scanned)
    assert [d for d in local if of_gpu(d, FABRIC_GPU)] == []
    assert [(d.kind, d.local_id) for d in fabric] == [("gpu", FABRIC_GPU)]
    # The local GPUs keep all of theirs, in the scan's (first-fit) order.
    assert local == [d for d in scanned if not of_gpu(d, FABRIC_GPU)]
    assert {d.kind for d in local} == {"gpu", "mig", "shared-gpu"}
    assert sum(d.kind == "gpu" for d in local) == 4
    # Nor its counters: the node's pool keeps the sets its local devices draw on.
    published = drawn_on(found.counter_sets, local)
    fabric_sets = {
        c.counter_set for d in scanned if of_gpu(d, FABRIC_GPU) for c in d.consumes_counters
    }
    assert fabric_sets and not fabric_sets & {s.name for s in published}
    assert {s.name for s in found.counter_sets} - {s.name for s in published} == fabric_sets


def test_a_fabric_gpu_gone_from_sysfs_takes_its_parts_along(tmp_path: Path) -> None:
    host, _, gpus, view = node_with_a_fabric_gpu(tmp_path)
    scanned = list(gpus.discover().devices)
    whole = next(d for d in scanned if d.local_id == FABRIC_GPU and d.kind == "gpu")
    host.hot_remove(str(whole.attributes["resource.kubernetes.io/pciBusID"]))
    local, fabric = view.split(scanned)  # the scan saw it; the detach removed it since
    assert fabric == [] and [d for d in local if of_gpu(d, FABRIC_GPU)] == []


def report_busy(
    view: FabricNodeView, fabric: list[Device], held: Collection[tuple[str, str]]
) -> frozenset[str]:
    return view.report(fabric, held).busy


def test_the_report_marks_a_fabric_gpu_busy_while_a_claim_holds_any_part(tmp_path: Path) -> None:
    _, _, gpus, view = node_with_a_fabric_gpu(tmp_path)
    scanned = list(gpus.discover().devices)
    _, fabric = view.split(scanned)
    parts = {d.kind: d for d in scanned if of_gpu(d, FABRIC_GPU) and d.kind != "gpu"}
    local_mig = next(d for d in scanned if d.kind == "mig" and not of_gpu(d, FABRIC_GPU))
    assert report_busy(view, fabric, []) == frozenset()
    assert report_busy(view, fabric, [("gpu", FABRIC_GPU)]) == {FABRIC_GPU}
    # Held before the fix (or by a plugin before an upgrade): a placement, a share.
    assert report_busy(view, fabric, [("mig", parts["mig"].local_id)]) == {FABRIC_GPU}
    assert report_busy(view, fabric, [("shared-gpu", parts["shared-gpu"].local_id)]) == {FABRIC_GPU}
    assert report_busy(view, fabric, [("mig", local_mig.local_id)]) == frozenset()


def test_nvml_says_why_a_gpu_is_in_use(tmp_path: Path) -> None:
    _, machine, gpus, _ = node_with_a_fabric_gpu(tmp_path)
    probe = nvml_probe([gpus])
    assert probe is not None
    assert probe([FABRIC_GPU]) == {}
    machine.set_processes(FABRIC_GPU, [4242])
    assert probe([FABRIC_GPU]) == {FABRIC_GPU: "processes 4242 run on it"}
    machine.set_processes(FABRIC_GPU, [])
    nvml = FakeNvml(machine)
    nvml.init()
    nvml.set_mig_mode(FABRIC_GPU, True)
    nvml.create_compute_instance(FABRIC_GPU, nvml.create_gpu_instance(FABRIC_GPU, 9, 4))
    nvml.shutdown()
    assert gpus_in_use(nvml, None, [FABRIC_GPU]) == {FABRIC_GPU: "1 MIG instances exist on it"}
    machine.remove_gpu(FABRIC_GPU)  # gone: nothing can use it any more
    assert gpus_in_use(nvml, None, [FABRIC_GPU]) == {}


class Probe:
    """NVML's answer, set by the test; counts the probes."""

    def __init__(self) -> None:
        self.answer: dict[str, str] = {}
        self.asked: list[list[str]] = []

    def __call__(self, uuids: Collection[str]) -> Mapping[str, str]:
        self.asked.append(sorted(uuids))
        return {u: why for u, why in self.answer.items() if u in uuids}


async def test_a_released_gpu_stays_busy_until_nvml_says_it_is_free() -> None:
    probe = Probe()
    usage = FabricUsage(probe)
    changes: list[None] = []
    usage.on_change = lambda: changes.append(None)
    assert usage.busy(["G1", "G2"], ["G1", "G2"]) == set()  # held: the claims say busy
    probe.answer = {"G1": "processes 7 run on it"}
    # G1's claim is released while a process still runs on it.
    assert usage.busy(["G1", "G2"], ["G2"]) == {"G1"}  # before any probe: not free
    await usage.probe_once()
    assert probe.asked == [["G1"]]  # a GPU a claim holds is not asked about
    assert usage.busy(["G1", "G2"], ["G2"]) == {"G1"}
    assert changes == [None]
    probe.answer = {}
    await usage.probe_once()
    assert usage.busy(["G1", "G2"], ["G2"]) == set()
    assert len(changes) == 2


async def test_a_gpu_released_again_while_nvml_is_asked_waits_for_the_next_answer() -> None:
    asked, answer = threading.Event(), threading.Event()

    def slow_probe(uuids: Collection[str]) -> Mapping[str, str]:
        asked.set()
        answer.wait(5)
        return {}

    usage = FabricUsage(slow_probe)
    usage.busy(["G1"], ["G1"])
    assert usage.busy(["G1"], []) == {"G1"}
    probing = asyncio.create_task(usage.probe_once())
    await asyncio.to_thread(asked.wait, 5)
    usage.busy(["G1"], ["G1"])  # held and released again while NVML is asked
    assert usage.busy(["G1"], []) == {"G1"}
    answer.set()
    await probing
    assert usage.busy(["G1"], []) == {"G1"}  # that answer predates this release
    await usage.probe_once()
    assert usage.busy(["G1"], []) == set()


async def test_a_process_ending_is_seen_by_the_periodic_probe() -> None:
    """Processes come and go with no event: while a GPU is idle, NVML is asked again."""
    probe = Probe()
    probe.answer = {"G1": "processes 7 run on it"}
    usage = FabricUsage(probe, interval=0.02)
    changed = asyncio.Event()
    usage.on_change = changed.set
    task = asyncio.create_task(usage.run())
    try:
        usage.busy(["G1", "G2"], ["G2"])  # G1 newly idle: probed at once
        await asyncio.wait_for(changed.wait(), 5)
        assert usage.busy(["G1", "G2"], ["G2"]) == {"G1"}
        changed.clear()
        probe.answer = {}  # no call of busy() from here: only the interval brings a probe
        await asyncio.wait_for(changed.wait(), 5)
        assert usage.busy(["G1", "G2"], ["G2"]) == set()
    finally:
        task.cancel()


async def test_a_gpu_attached_and_not_yet_held_is_not_reported_busy_meanwhile() -> None:
    """A fresh warm spare: reported busy, the controller would not count it."""
    probe = Probe()
    usage = FabricUsage(probe)
    assert usage.busy(["G1"], []) == set()
    await usage.probe_once()
    assert probe.asked == [["G1"]] and usage.busy(["G1"], []) == set()


def test_the_report_takes_what_nvml_says_of_a_gpu_no_claim_holds(tmp_path: Path) -> None:
    _, _, gpus, view = node_with_a_fabric_gpu(tmp_path)
    _, fabric = view.split(list(gpus.discover().devices))
    usage = FabricUsage(Probe())
    usage.busy([FABRIC_GPU], [FABRIC_GPU])
    # Released, not probed since: busy in the report until NVML answers.
    assert view.report(fabric, [], usage).busy == {FABRIC_GPU}


def test_the_simulated_host_records_a_gpu_removed_while_in_use(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path, "node-a")
    free, used = host.free_bdf("adapter0"), host.free_bdf("adapter1")
    host.hot_add("adapter0", Gpu(free, uuid="GPU-00000000-0000-4000-8000-0000000000a1"))
    host.hot_add("adapter1", Gpu(used, uuid="GPU-00000000-0000-4000-8000-0000000000a2"))
    host.nvml.set_processes("GPU-00000000-0000-4000-8000-0000000000a2", [31337])
    assert host.hot_remove(free) == [free]
    assert violations.read(host.dir) == []
    assert host.hot_remove(used) == [used]  # not refused, as on a real host
    (entry,) = violations.read(host.dir)
    assert (entry["bdf"], entry["inUse"]) == (used, "processes 31337")
    assert not host.tree.exists(used)
