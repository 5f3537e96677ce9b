"""The node plugin's device gauges, counted from what the plugin holds.

Why: ``patchbay_devices``, ``patchbay_devices_tainted`` and
``patchbay_devices_prepared`` (``driver.metrics``) describe state the plugin
already keeps (the inventory's pools, the health monitor's verdicts and
taints, the checkpoint's prepared claims), so they are counted from it at
scrape time instead of being kept up to date beside it. MIG devices are the
published placements (one per profile and position), prepared ones the
instances that claims hold; fabric devices are those attached to this node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from driver.devices.model import Device
from driver.health.model import HealthStatus
from driver.health.monitor import HealthMonitor
from driver.metrics import DEVICES, DEVICES_PREPARED, DEVICES_TAINTED, Samples

HEALTH = (HealthStatus.HEALTHY.value, HealthStatus.UNHEALTHY.value)


class DeviceCounts:
    """Counts of one scrape: by (attachment, type[, health])."""

    def __init__(
        self,
        pools: Mapping[str, Sequence[Device]],
        fabric_pool: str,
        health: HealthMonitor,
        prepared: Collection[tuple[str, str]],
    ) -> None:
        bad = {
            (h.pool_name, h.device_name)
            for h in health.snapshot()
            if h.status is HealthStatus.UNHEALTHY
        }
        self.devices: Counter[tuple[str, str, str]] = Counter()
        self.tainted: Counter[tuple[str, str]] = Counter()
        self.prepared: Counter[tuple[str, str]] = Counter()
        for pool, devices in pools.items():
            attachment = "fabric" if pool == fabric_pool else "local"
            for d in health.tainted(devices):
                key = (attachment, d.kind)
                state = HealthStatus.UNHEALTHY if (pool, d.name) in bad else HealthStatus.HEALTHY
                self.devices[(*key, state.value)] += 1
                self.tainted[key] += bool(d.taints)
                self.prepared[key] += (d.kind, d.local_id) in prepared

    def device_samples(self) -> Samples:
        kinds = sorted({k[:2] for k in self.devices})
        # Both health values of every (attachment, type) present: 0 is a value, not a gap.
        return [((*k, h), float(self.devices[(*k, h)])) for k in kinds for h in HEALTH]

    @staticmethod
    def _of(counts: Counter[tuple[str, str]]) -> Samples:
        return [(k, float(counts[k])) for k in sorted(counts)]

    def tainted_samples(self) -> Samples:
        return self._of(self.tainted)

    def prepared_samples(self) -> Samples:
        return self._of(self.prepared)


class Counted(Protocol):
    def device_counts(self) -> DeviceCounts: ...


def export_device_counts(owner: Counted) -> None:
    """Read the device gauges from ``owner.device_counts()`` at each scrape, while it lives."""
    DEVICES.add_source(owner, lambda o: o.device_counts().device_samples())
    DEVICES_TAINTED.add_source(owner, lambda o: o.device_counts().tainted_samples())
    DEVICES_PREPARED.add_source(owner, lambda o: o.device_counts().prepared_samples())
