"""The scale bench's fabric pool and figures (``tests/bench/scale_fabric.py``,
``scale_figures.py``) measure what issue 34 asks.

The bench's before/after is only as good as its pools: in the per-domain
shape the fabric pool must be the controller's (each device once, selecting
the nodes by the reach label the bench gives them, whatever the node count),
and the per-node one a variant per device and node. Its verdicts are ratios
of the bursts' medians, not of one burst.
"""

from __future__ import annotations

from typing import Any

from driver.slices.build import build_slices
from tests.bench.scale_fabric import fabric_pools, is_adapter_pool, reach_labels
from tests.bench.scale_figures import WITHOUT, Burst, Figures


def nodes(n: int, shape: str) -> list[dict[str, Any]]:
    labels = reach_labels(shape)
    return [{"metadata": {"name": f"node-{i}", "uid": f"u{i}", "labels": labels}} for i in range(n)]


def test_per_domain_pool_is_each_device_once_whatever_the_nodes() -> None:
    (label,) = reach_labels("per-domain")
    for n in (3, 30):
        specs = fabric_pools("per-domain", 200, nodes(n, "per-domain"))
        (domain,) = [s for s in specs if not is_adapter_pool(s.pool_name)]
        assert len(domain.devices) == 200
        assert len(build_slices(domain)) == 2  # at most 128 devices a slice
        term = domain.node_selection["nodeSelector"]["nodeSelectorTerms"][0]
        assert term["matchExpressions"][0]["key"] == label
        assert [s.node_selection for s in specs if is_adapter_pool(s.pool_name)] == [
            {"nodeName": f"node-{i}"} for i in sorted(range(n), key=lambda i: f"node-{i}")
        ]
        (per_node,) = fabric_pools("per-node", 16, nodes(n, "per-node"))
        assert len(per_node.devices) == 16 * n  # the shape before: a variant per device and node
    assert reach_labels("per-node") == {}


def test_ratios_are_of_the_bursts_medians() -> None:
    figures = Figures()
    for cpu in (0.1, 0.1, 5.0):  # one burst slowed by a neighbour
        figures.add("whole GPU", WITHOUT, Burst(10, (1.0,) * 10, 2.0, cpu))
    for cpu in (0.12, 0.12, 0.12):
        figures.add("whole GPU", "16 devices", Burst(10, (1.0,) * 10, 2.0, cpu))
    text = figures.ratios("plain GPU (base)", "fabric GPU")
    assert "with 16 devices / without (<= 1.25x): whole GPU 1.20x met" in text
    assert "CPU 10 ms/pod (10-500)" in figures.table()
