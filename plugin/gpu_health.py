"""The plugin's GPU health parts, built from its settings and device families.

Why a module: the health monitor needs the GPU family's NVML (to class an
XID by the GPU's condition), the boot id and the plugin directory (its
records survive restarts); the recovery needs the XID watcher (paused for a
reset), nvidia-smi and the prepared claims (no reset while one uses the
GPU); the history follows the records onto the Node's health annotation.
``plugin.app`` wires them with one call each.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from driver.checkpoint import DeviceRecord, read_boot_id
from driver.claims.preparer import ClaimPreparer
from driver.devices.kind import DeviceType
from driver.errors import PatchbayError
from driver.gpu.kind import GpuType
from driver.health.history import HEALTH_ANNOTATION, node_health
from driver.health.monitor import HealthMonitor
from driver.health.records import HealthRecords
from driver.health.recovery import GpuRecovery
from driver.health.reset import NodeGpuOps
from driver.health.xid import XidWatcher
from driver.kube.client import KubeClient
from driver.kube.node_annotation import NodeAnnotation
from driver.metrics import GPUS_UNHEALTHY, Samples
from driver.nvml.condition import GpuCondition
from plugin.settings import PluginSettings

log = logging.getLogger(__name__)


def _gpu_family(types: Sequence[DeviceType]) -> GpuType | None:
    return next((t for t in types if isinstance(t, GpuType) and t.nvml is not None), None)


def health_monitor(settings: PluginSettings, types: Sequence[DeviceType]) -> HealthMonitor:
    """The monitor over ``<plugin dir>/gpu-health.json``, classing XIDs through NVML."""
    try:
        boot = read_boot_id(settings.boot_id_file)
    except PatchbayError as exc:
        log.warning("GPU health: %s (a reboot will not be noticed)", exc)
        boot = ""
    gpus = _gpu_family(types)
    condition: Callable[[str], GpuCondition | None] | None = None
    if gpus is not None and gpus.nvml is not None:
        ops = NodeGpuOps(gpus.nvml, settings.nvidia_smi_path, gpus.nvml_lock)

        def read(uuid: str) -> GpuCondition | None:
            try:
                return ops.condition(uuid)
            except PatchbayError as exc:  # lost, say: the XID table decides
                log.info("GPU %s: condition unreadable after an XID: %s", uuid, exc)
                return None

        condition = read
    monitor = HealthMonitor(settings, HealthRecords.in_dir(settings.plugin_dir), condition, boot)
    GPUS_UNHEALTHY.add_source(monitor, unhealthy_samples)
    return monitor


def unhealthy_samples(monitor: HealthMonitor) -> Samples:
    """``patchbay_gpus_unhealthy``: GPUs by (class, phase)."""
    counts = Counter((r.failure_class, r.phase) for r in monitor.unhealthy().values())
    return [(key, float(n)) for key, n in sorted(counts.items())]


def in_use_by_claims(
    prepared: Callable[[], Iterable[DeviceRecord]], monitor: HealthMonitor
) -> Callable[[str], bool]:
    """Whether a prepared (or preparing) claim's device is the GPU or one of its
    devices (MIG devices, its fractional twin); admin-access views count too."""

    def in_use(uuid: str) -> bool:
        names = set(monitor.names(uuid))
        return any(d.local_id == uuid or d.device_name in names for d in prepared())

    return in_use


def gpu_recovery(
    settings: PluginSettings,
    types: Sequence[DeviceType],
    monitor: HealthMonitor,
    watcher: XidWatcher | None,
    preparer: ClaimPreparer,
) -> GpuRecovery | None:
    """The recovery task's object (None without GPUs through NVML); wakes on
    every health record change, and on a change of the prepared claims while
    a GPU has a record (``GpuRecovery.claims_changed``)."""
    gpus = _gpu_family(types)
    if gpus is None or gpus.nvml is None:
        return None
    ops = NodeGpuOps(gpus.nvml, settings.nvidia_smi_path, gpus.nvml_lock, watcher)

    def prepared() -> Iterable[DeviceRecord]:
        return (d for c in preparer.checkpoint.claims.values() for d in c.devices)

    in_use = in_use_by_claims(prepared, monitor)
    recovery = GpuRecovery(monitor, settings, ops, in_use, claim_lock=preparer.lock)
    monitor.on_record = recovery.wake
    before = preparer.on_change

    def changed() -> None:
        if before is not None:
            before()
        recovery.claims_changed()

    preparer.on_change = changed
    return recovery


class HealthHistory:
    """The Node's ``patchbay.dev/health`` annotation, rebuilt after every save of
    the health file (:mod:`driver.health.history`); written only when it changed."""

    def __init__(self, settings: PluginSettings, api: KubeClient, monitor: HealthMonitor) -> None:
        self.settings = settings
        self.monitor = monitor
        self.annotation = NodeAnnotation(
            api, settings.node_name, HEALTH_ANNOTATION, "GPU health history"
        )
        monitor.records.on_saved = self.update

    def start(self, node: Mapping[str, Any]) -> None:
        """What the Node holds, then what the file says (a restart writes only a difference)."""
        self.annotation.seed(node)
        self.update()

    def update(self) -> None:
        s = self.settings
        report = node_health(self.monitor.records, s.gpu_reset_limit, s.gpu_reset_window)
        self.annotation.set(report.to_annotation())
