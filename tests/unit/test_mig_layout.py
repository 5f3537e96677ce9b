"""Dynamic MIG discovery: counter sets, partition devices, order, slice limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.checkpoint import Checkpoint
from driver.devices.kind import Discovery
from driver.devices.model import Device
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.layout import parse_local_id, placement_of
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices import limits
from driver.slices.build import PoolSpec, build_slices

# ARCHITECTURE section 6: (compute slices, memory slots) -> placement starts.
TABLE = {
    (1, 1, False): [0, 1, 2, 3, 4, 5, 6],
    (1, 1, True): [0],  # +me: the lowest start only (issue 26)
    (1, 2, False): [0, 2, 4, 6],
    (2, 2, False): [0, 2, 4],
    (3, 4, False): [0, 4],
    (4, 4, False): [0],
    (7, 8, True): [0],
}


# What a lean MIG device publishes (issue 26; the fake host has no sysfs, so
# no pcieRoot or numaNode here).
LEAN = {"profile", "memorySlots", "computeSlices", "mediaEngines", "attachment"}


def names(one: str, two: str, four: str, eight: str) -> set[str]:
    return {f"1g.{one}", f"1g.{one}+me", f"1g.{two}", f"2g.{two}", f"3g.{four}", f"4g.{four}",
            f"7g.{eight}"}  # fmt: skip


NAMES = {
    "A100-SXM4-40GB": names("5gb", "10gb", "20gb", "40gb"),
    "A100-SXM4-80GB": names("10gb", "20gb", "40gb", "80gb"),
    "H100-SXM5-80GB": names("10gb", "20gb", "40gb", "80gb"),
    "H200-SXM5-141GB": names("18gb", "35gb", "71gb", "141gb"),
}


def node(
    model: str, count: int, *, policy: MigPolicy | None = None, mig: bool = False
) -> tuple[GpuType, FakeMachine, MigSupport]:
    machine = FakeMachine()
    for i in range(count):
        machine.add_gpu(f"GPU-{i:04d}", model, f"0000:{0x10 + i:02x}:00.0", mig=mig)
    backend = FakeNvml(machine)
    session = NvmlSession(backend)
    support = MigSupport(
        session,
        policy or MigPolicy.parse("all", "", True, False),
        lambda s, g: MigHandler(s, g, Path("/nonexistent")),
        Checkpoint,
    )
    return (
        GpuType(backend, Path("/nonexistent"), Path("/nonexistent"), mig=support),
        machine,
        support,
    )


def migs(found: Discovery) -> list[Device]:
    return [d for d in found.devices if d.kind == "mig"]


@pytest.mark.parametrize("model", sorted(NAMES))
def test_placements_and_counters_match_the_table(model: str) -> None:
    gpu_type, _, _ = node(model, 1, mig=model.startswith("A100"))
    found = gpu_type.discover()
    (cset,) = found.counter_sets
    assert cset.name == "gpu-0-mig" and limits.is_dns_label(cset.name)
    assert dict(cset.counters) == {
        **{f"mem{i}": "1" for i in range(8)},
        "compute": "7",
        "media": "1",
    }
    devices = migs(found)
    assert {str(d.attributes["profile"]) for d in devices} == NAMES[model]
    starts: dict[tuple[int, int, bool], list[int]] = {}
    for d in devices:
        (use,) = d.consumes_counters
        counters = dict(use.counters)
        slots = sorted(int(k[3:]) for k in counters if k.startswith("mem"))
        key = (int(counters["compute"]), len(slots), "media" in counters)
        starts.setdefault(key, []).append(slots[0])
        assert slots == list(range(slots[0], slots[0] + len(slots))), "contiguous slots"
        assert parse_local_id(d.local_id) == ("GPU-0000", parse_local_id(d.local_id)[1], slots[0])
        assert limits.device_problems(d) == []
        assert d.parent == "GPU-0000" and placement_of(d) == (0, slots[0])
        assert set(d.attributes) == LEAN and set(d.capacity) == {"memory"}
        assert d.capacity["memory"].endswith("Mi")
    assert {k: sorted(v) for k, v in starts.items()} == TABLE
    full = [d for d in found.devices if d.kind == "gpu"]
    if model.startswith("A100"):
        assert full == [], "Ampere in MIG mode is offered as partitions only"
    else:
        (whole,) = full
        (use,) = whole.consumes_counters
        assert use.counter_set == "gpu-0-mig" and dict(use.counters) == dict(cset.counters)


def test_ampere_not_in_mig_mode_and_unselected_gpus_stay_whole() -> None:
    gpu_type, _, _ = node("A100-SXM4-80GB", 2)
    found = gpu_type.discover()
    assert found.counter_sets == () and [d.name for d in found.devices] == ["gpu-0", "gpu-1"]
    assert not any(d.has_counters() for d in found.devices)
    gpu_type, _, _ = node("H100-SXM5-80GB", 2, policy=MigPolicy.parse("1", "", True, False))
    found = gpu_type.discover()
    assert [s.name for s in found.counter_sets] == ["gpu-1-mig"]
    assert {placement_of(d)[0] for d in migs(found)} == {1}
    gpu0 = next(d for d in found.devices if d.name == "gpu-0")
    assert not gpu0.has_counters()


def test_profile_and_media_selection() -> None:
    policy = MigPolicy.parse("all", "1g,3g.40gb", False, False)
    gpu_type, _, _ = node("H100-SXM5-80GB", 1, policy=policy)
    found = gpu_type.discover()
    assert {d.attributes["profile"] for d in migs(found)} == {"1g.10gb", "1g.20gb", "3g.40gb"}


def test_eight_h200_publish_within_limits_with_profiles_unsplit() -> None:
    gpu_type, _, _ = node("H200-SXM5-141GB", 8)
    found = gpu_type.discover()
    assert len(found.devices) == 8 * (1 + 7 + 1 + 4 + 3 + 2 + 1 + 1) == 160
    names = [d.name for d in found.devices]
    assert len(set(names)) == 160 and all(limits.is_dns_label(n) for n in names)
    slices = build_slices(
        PoolSpec(
            "patchbay.dev", "n", "n-patchbay", {"nodeName": "n"}, found.devices, found.counter_sets
        )
    )
    counter_slices = [s for s in slices if "sharedCounters" in s.spec]
    device_slices = [s for s in slices if "devices" in s.spec]
    assert len(counter_slices) == 1 and len(counter_slices[0].spec["sharedCounters"]) == 8
    assert [len(s.spec["devices"]) for s in device_slices] == [64, 64, 32]
    for s in slices:
        assert not ("devices" in s.spec and "sharedCounters" in s.spec)
    # Every profile's candidates sit in one slice (slice order is random in the scheduler).
    where: dict[str, set[int]] = {}
    by_name = {d.name: d for d in found.devices}
    for i, s in enumerate(device_slices):
        for dev in s.spec["devices"]:
            d = by_name[dev["name"]]
            where.setdefault(str(d.attributes.get("profile", "full")), set()).add(i)
            assert len(dev.get("consumesCounters", [])) <= limits.MAX_CONSUMPTIONS
    assert all(len(v) == 1 for v in where.values()), where


def test_order_from_the_bottom_balanced_by_gpu_memory_heavy_by_placement() -> None:
    gpu_type, _, _ = node("H100-SXM5-80GB", 2)
    devices = gpu_type.discover().devices

    def order(profile: str) -> list[tuple[object, object]]:
        return [placement_of(d) for d in devices if d.attributes.get("profile") == profile]

    # Balanced (memory slots == compute): GPU by GPU from the bottom, left half first.
    assert order("1g.10gb") == [(g, s) for g in (0, 1) for s in (3, 2, 1, 0, 6, 5, 4)]
    assert order("2g.20gb") == [(0, 2), (0, 0), (0, 4), (1, 2), (1, 0), (1, 4)]
    assert order("4g.40gb") == [(0, 0), (1, 0)]
    # Memory-heavy: one placement across the GPUs from the bottom, then the next.
    assert order("3g.40gb") == [(0, 4), (1, 4), (0, 0), (1, 0)]
    assert order("1g.20gb") == [(g, s) for s in (6, 4, 2, 0) for g in (0, 1)]
    assert order("7g.80gb") == [(0, 0), (1, 0)]
    assert [d.name for d in devices if d.kind == "gpu"] == ["gpu-1", "gpu-0"]


def test_full_gpus_come_before_every_placement_on_four_h100() -> None:
    """The full GPUs (in their own order: from the top down) head the pool, so a
    whole-GPU request walks no placement (``driver.slices.order``). Arranged
    from the top of the slice, 4 x H100's 1g, 1g.20gb, 2g and 3g groups
    filled the first 64 exactly and put the full GPUs in the second slice."""
    gpu_type, _, _ = node("H100-SXM5-80GB", 4)
    devices = gpu_type.discover().devices
    assert [d.name for d in devices[:5]] == ["gpu-3", "gpu-2", "gpu-1", "gpu-0", devices[4].name]
    assert devices[4].kind == "mig" and all(d.kind == "mig" for d in devices[4:])
