"""mig_bounds' compact model must replay a stream exactly as the bench's
first-fit model does, or its bounds would not be comparable."""

from __future__ import annotations

import pytest

from driver.devices.kind import Discovery
from tests.bench import mig_bench, mig_bounds


@pytest.fixture(scope="module")
def found() -> Discovery:
    return mig_bench.discovery(gpus=3)


@pytest.mark.parametrize("order", ["name", "static"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compact_replays_like_first_fit(found: Discovery, order: str, seed: int) -> None:
    ops = mig_bench.stream(seed, 200, 0.4)
    expected = mig_bench.serve(found, order, ops, seed)
    devices = found.devices
    if order == "name":
        devices = tuple(sorted(devices, key=lambda d: d.name))
    _, walk = mig_bounds.candidates(mig_bench.layout(found, devices))
    refusals, compute = mig_bounds.cost(walk, len(found.counter_sets), [ops])
    assert (refusals, compute) == (expected.fragmentation, expected.compute)
    assert expected.fragmentation > 0  # the stream exercises the metric


def test_left_out_placements_are_not_offered(found: Discovery) -> None:
    _, walk = mig_bounds.candidates(mig_bench.layout(found, found.devices))
    only_7g = [c for c in walk if c.profile == "7g.141gb"]
    rest = [c for c in walk if c.profile != "7g.141gb"]
    ops = [("1g.18gb", 0.0)] * 3
    refusals, compute = mig_bounds.cost([*only_7g, None, *rest], len(found.counter_sets), [ops])
    assert compute == 0  # no 1g placement offered
    assert refusals == 3  # each GPU had the room: counted as fragmentation
