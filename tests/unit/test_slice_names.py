"""Slice names sort in build order (``driver.slices.build.slice_name``): the
allocator that 1.36+ runs with its default gates walks a pool's slices in
name order (``structured/internal/incubating``, ``buildPool``), so our device
order is the scheduler's first-fit order across the whole pool."""

from __future__ import annotations

from driver.devices.model import CounterConsumption, Device
from driver.slices.build import PoolSpec, build_slices, slice_name


def pool(count: int) -> PoolSpec:
    use = (CounterConsumption("gpu-0-mig", (("mem0", "1"),)),)
    devices = tuple(
        Device(name=f"d-{i}", kind="mig", local_id=f"x-{i}", consumes_counters=use)
        for i in range(count)
    )
    return PoolSpec("patchbay.dev", "n1", "n1-patchbay", {"nodeName": "n1"}, devices)


def test_up_to_ten_slices_keep_their_names() -> None:
    names = [s.name for s in build_slices(pool(64 * 10))]
    assert names == [f"n1-patchbay-{i}" for i in range(10)]  # as before: no rename on upgrade


def test_more_than_ten_slices_sort_by_name_in_build_order() -> None:
    slices = build_slices(pool(64 * 11 + 1))
    names = [s.name for s in slices]
    assert len(names) == 12 and names[:2] == ["n1-patchbay-00", "n1-patchbay-01"]
    assert sorted(names) == names  # "-10" would sort before "-2" unpadded
    walked = [d["name"] for s in sorted(slices, key=lambda s: s.name) for d in s.spec["devices"]]
    assert walked == [f"d-{i}" for i in range(64 * 11 + 1)]


def test_slice_name_pads_to_the_widest_index() -> None:
    assert slice_name("p", 0, 1) == "p-0"
    assert slice_name("p", 3, 10) == "p-3"
    assert slice_name("p", 3, 11) == "p-03"
    assert slice_name("p", 7, 101) == "p-007"
