"""The scale bench's byte accounting (``tests/bench/scale_bytes.py``) adds up.

The leaner-slices work (issue 26) is judged by bytes per MIG-capable GPU and
by where they go; these tests hold the accounting honest: every byte of a
MIG node's slices falls in exactly one part, and the figure is per GPU.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.scale_bytes import breakdown, bytes_per_mig_gpu, mig_slices, placements, size
from tests.bench.scale_pool import HostPools


def test_the_parts_add_up_to_the_slices(tmp_path: Path) -> None:
    slices = mig_slices(HostPools(work=tmp_path))
    parts = breakdown(slices)
    assert sum(parts.values()) == sum(size(s) for s in slices)
    assert all(n > 0 for n in parts.values()), parts


def test_bytes_are_per_mig_capable_gpu(tmp_path: Path) -> None:
    pools = HostPools(work=tmp_path)
    slices = mig_slices(pools)
    gpus = {
        d["attributes"]["parentUUID"]["string"]
        for s in slices
        for d in s["spec"].get("devices") or []
        if "parentUUID" in d["attributes"]
    }
    assert len(gpus) == 4
    assert bytes_per_mig_gpu(pools) == sum(size(s) for s in slices) / 4
    assert placements(slices)["7g.80gb"] == 1  # one GPU's placement set, not the node's
