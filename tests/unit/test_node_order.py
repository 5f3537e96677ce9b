"""The order a node's own pool is published in (issue 34, step 3): full GPUs,
shares and VFs at the head of its first device slice, the MIG placements
after them, each kind in its own order (``driver.slices.order``).

The allocator walks a pool's slices in name order and each slice's devices
in order, evaluating the request's class on each until one fits; so the
order asserted here is the one the scheduler sees, through the plugin's own
``publish`` and the slice builder, on the scale bench's simulated 4 x H100
host with dynamic MIG, shares and 16 VFs.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from driver.devices.kind import scan_all
from driver.devices.model import Device
from driver.kube.api import KubeApi
from driver.slices import limits
from driver.slices.build import PoolSpec, build_slices
from driver.slices.order import HEAD_KINDS, arrange_groups, node_order
from plugin.app import NodePlugin
from plugin.settings import PluginSettings
from tests.bench.scale_pool import MIG_NODE, HostPools

NODE = "node-a"


def profile(device: Device) -> str:
    return str(device.attributes.get("profile", device.kind))


def by_kind(devices: list[Device]) -> dict[str, list[str]]:
    """Each kind's (each MIG profile's) device names, in order."""
    out: dict[str, list[str]] = {}
    for d in devices:
        out.setdefault(profile(d), []).append(d.name)
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Device], PoolSpec]:
    """The families' own scan, and the pool the plugin's ``publish`` declares."""
    pools = HostPools(work=tmp_path_factory.mktemp("host"))
    families = pools.families(NODE, MIG_NODE)
    scanned = list(scan_all(families).devices)
    plugin = NodePlugin(PluginSettings(node_name=NODE), cast(KubeApi, object()), families)
    declared: list[PoolSpec] = []
    plugin.publisher.set_pool = declared.append  # type: ignore[method-assign,assignment]
    plugin.owner = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u"}
    asyncio.run(plugin.rescan())  # scans the families and publishes the pool
    return scanned, declared[-1]


def allocator_order(pool: PoolSpec) -> list[list[str]]:
    """Device names per device slice, slices in name order (the allocator's walk)."""
    slices = sorted(build_slices(pool), key=lambda s: s.name)
    return [[d["name"] for d in s.spec["devices"]] for s in slices if "devices" in s.spec]


def test_full_gpus_shares_and_vfs_come_before_every_placement(
    published: tuple[list[Device], PoolSpec],
) -> None:
    _, pool = published
    kinds = {d.name: d.kind for d in pool.devices}
    walk = [kinds[n] for names in allocator_order(pool) for n in names]
    assert walk[:24] == ["gpu"] * 4 + ["shared-gpu"] * 4 + ["vf"] * 16
    assert set(walk[24:]) == {"mig"} and len(walk) == 100
    # A whole-GPU request's first fit on an empty node is the first device it looks at.
    assert walk.index("gpu") == 0 and walk.index("shared-gpu") == 4 and walk.index("vf") == 8


def test_each_kind_and_profile_keeps_its_own_order(
    published: tuple[list[Device], PoolSpec],
) -> None:
    """No first fit changes: full GPUs and each MIG profile in ``driver.mig.order``'s
    order, shares and VFs as their families list them."""
    scanned, pool = published
    names = {d.name: d for d in pool.devices}
    walked = [names[n] for s in allocator_order(pool) for n in s]
    assert by_kind(walked) == by_kind(scanned)
    assert sorted(d.name for d in walked) == sorted(d.name for d in scanned)


def test_the_slice_limits_hold_and_no_profile_is_cut(
    published: tuple[list[Device], PoolSpec],
) -> None:
    _, pool = published
    names = {d.name: d for d in pool.devices}
    slices = allocator_order(pool)
    assert [len(s) for s in slices] == [64, 36]
    assert all(len(s) <= limits.MAX_DEVICES_WITH_COUNTERS_OR_TAINTS for s in slices)
    where: dict[str, set[int]] = {}
    for i, s in enumerate(slices):
        for n in s:
            where.setdefault(profile(names[n]), set()).add(i)
    assert all(len(v) == 1 for v in where.values()), where
    counter_slices = [s for s in build_slices(pool) if "sharedCounters" in s.spec]
    assert len(counter_slices) == 1 and len(counter_slices[0].spec["sharedCounters"]) == 4


def test_a_pool_of_only_head_kinds_or_only_placements_keeps_its_order() -> None:
    gpus = [Device(f"gpu-{i}", "gpu", f"u{i}") for i in (1, 0)]
    vfs = [Device(f"vf-{i}", "vf", f"b{i}") for i in range(3)]
    assert node_order([*vfs, *gpus]) == [*gpus, *vfs]
    assert HEAD_KINDS[0] == "gpu"
    migs = [Device(f"m-{i}", "mig", f"m{i}", {"profile": "1g"}) for i in range(3)]
    assert node_order(migs) == migs


def test_groups_are_arranged_for_the_room_left_after_the_head() -> None:
    def group(tag: str, n: int) -> list[Device]:
        return [Device(f"{tag}-{i}", "mig", tag, {"profile": tag}) for i in range(n)]

    a, b, c = group("a", 30), group("b", 10), group("c", 4)
    # From the top of a slice (room 64) all three fit in their order; with 60
    # devices ahead only c fits the 4 left, and a and b open the next slice.
    assert arrange_groups([a, b, c], 64) == [*a, *b, *c]
    assert arrange_groups([a, b, c], 64, start=60) == [*c, *a, *b]
