"""The scale bench's byte accounting (``tests/bench/scale_bytes.py``) adds up.

The leaner-slices work (issue 26) is judged by bytes per MIG-capable GPU and
by where they go; these tests hold the accounting honest: every byte of a
MIG node's slices falls in exactly one part, and the figure is per GPU.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.mig_shape_v1 import old_shape
from tests.bench.scale_bytes import (
    before_after,
    breakdown,
    bytes_per_mig_gpu,
    gpu_of,
    mig_slices,
    placements,
    size,
)
from tests.bench.scale_pool import HostPools


def test_the_parts_add_up_to_the_slices(tmp_path: Path) -> None:
    slices = mig_slices(HostPools(work=tmp_path))
    parts = breakdown(slices)
    assert sum(parts.values()) == sum(size(s) for s in slices)
    assert all(n > 0 for n in parts.values()), parts


def test_bytes_are_per_mig_capable_gpu(tmp_path: Path) -> None:
    pools = HostPools(work=tmp_path)
    slices = mig_slices(pools)
    gpus = {gpu_of(d) for s in slices for d in s["spec"].get("devices") or []} - {None}
    assert len(gpus) == 4
    assert bytes_per_mig_gpu(pools) == sum(size(s) for s in slices) / 4
    assert placements(slices)["7g.80gb"] == 1  # one GPU's placement set, not the node's


def test_the_old_shape_is_the_one_measured_before_issue_26(tmp_path: Path) -> None:
    """mig_shape_v1 rebuilds, byte for byte, the pool docs/scale.md measured
    before the leaner slices (22080 bytes per GPU at a0bcfa2)."""
    pools = HostPools(work=tmp_path)
    with old_shape():
        slices = mig_slices(pools)
    assert sum(size(s) for s in slices) == 4 * 22080
    assert placements(slices)["1g.10gb+me"] == 7


def test_lean_slices_take_at_most_half_the_bytes(tmp_path: Path) -> None:
    before, after = before_after(HostPools(work=tmp_path))
    assert after <= before / 2, (before, after)
