"""The health of the plugin's devices, from GPU XIDs (KEP-4680).

Why: a GPU that reports a critical XID keeps running pods that can no
longer trust it. The kubelet's ``DRAResourceHealth`` stream puts each
device's health into the status of the pods using it, and the plugin
publishes an unhealthy GPU and its MIG devices with a device taint
(``DRADeviceTaints``) whose effect the GPU's failure class decides
(:mod:`driver.health.classes`, :mod:`driver.health.policy`): ``NoSchedule``
keeps new claims off it, ``NoExecute`` also evicts the pods using it. This
module keeps the complete list: every device of the plugin's pools,
``HEALTHY`` unless its GPU (a MIG device's parent GPU) has a record in
:class:`driver.health.records.HealthRecords`, which outlives the process:
a restart keeps a failed GPU tainted, and so does an unplug and re-plug.
Only :meth:`HealthMonitor.mark_healthy` (after a passing health check,
:mod:`driver.health.recovery`) ends a record, and, for a GPU a fabric
adapter brought, :meth:`HealthMonitor.detached`: the node never resets or
checks a fabric GPU (the controller detaches it and keeps its failure in
its pool), and a later attach of the same GPU starts without the old
record. VFs have no health source and stay healthy.

Concurrency: lives on the plugin's asyncio loop. :meth:`report_xid` may be
called from any thread: it reads the GPU's condition (NVML, blocking) there
and hops onto the loop; several kubelet streams can iterate :meth:`updates`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence

from driver.devices.model import ATTACHMENT, PCI_BUS_ID, Device, DeviceTaint
from driver.health.classes import FailureClass, classify, worst
from driver.health.model import DeviceHealth, HealthStatus
from driver.health.policy import HealthSettings
from driver.health.records import DETACHED, GpuRecord, HealthRecords, Phase
from driver.kube.events import ObjectEvents
from driver.metrics import GPU_FAILURES
from driver.nvml.backend import XID_FALLEN_OFF_BUS
from driver.nvml.condition import GpuCondition

log = logging.getLogger(__name__)

TAINT_KEY = "patchbay.dev/unhealthy"
DEVICE_UNHEALTHY = "DeviceUnhealthy"  # the Event reason on the Node (docs/events.md)
FAILED_AFTER_RESET = "failed-after-reset"


def gpu_of(device: Device) -> str | None:
    """The UUID of the GPU whose health decides this device's, if any."""
    if device.kind == "gpu":
        return device.local_id
    own = device.attributes.get("uuid")
    if isinstance(own, str) and own == device.local_id:
        return own  # another view of a whole GPU: its fractional twin (driver.gpu.fraction)
    return device.parent if device.kind == "mig" else None


def failure_class(record: GpuRecord) -> FailureClass:
    """The record's class; one this build does not know is REPLACE (never reset)."""
    try:
        return FailureClass(record.failure_class)
    except ValueError:
        return FailureClass.REPLACE


def taint_value(record: GpuRecord) -> str:
    """``xid-48``; one tainted after a failed recovery says why (``xid-48-reset-failed``)."""
    base = f"xid-{record.xid}"
    return f"{base}-{record.reason}" if record.phase == Phase.FAILED and record.reason else base


class HealthMonitor:
    """The latest health list of every device, and a change signal."""

    def __init__(
        self,
        settings: HealthSettings | None = None,
        records: HealthRecords | None = None,
        condition: Callable[[str], GpuCondition | None] | None = None,
        boot_id: str = "",
    ) -> None:
        self.settings = settings if settings is not None else HealthSettings()
        self.records = records if records is not None else HealthRecords(None)
        self._condition = condition
        self.boot_id = boot_id
        self._pools: dict[str, tuple[Device, ...]] = {}
        self._away: set[str] = set()  # GPUs with a record not on the node now
        # GPUs the plugin handed to vfio-pci: NVML loses them on purpose.
        self._handed_over: set[str] = set()
        self._since = int(time.time())
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # On the loop, after an XID or a recovery step changed a device's health
        # or taint (not after set_devices: the scan that called it publishes anyway).
        self.on_change: Callable[[], None] | None = None
        # On the loop, after a GPU's record changed (the recovery wakes up).
        self.on_record: Callable[[str], None] | None = None
        self.events: ObjectEvents | None = None  # the Node's, once the plugin knows it
        # Whether a GPU's leaving NVML is expected (a fabric GPU no claim holds: the
        # controller detaches only such a one); its XID 79 is then no failure.
        self.leaving: Callable[[str], bool] | None = None
        for uuid, record in self.records.load().items():
            cls = failure_class(record)
            if record.boot != boot_id and boot_id and not record.fabric and cls in (
                FailureClass.RESET, FailureClass.REBOOT
            ):  # fmt: skip
                # The node rebooted: that reset the GPU. Check it before it is healthy.
                record.phase, record.reason, record.boot = Phase.CHECKING, "", boot_id
                record.add("rebooted", "the node rebooted since the failure: checking the GPU")
                self.records.put(uuid, record)
            log.warning("GPU %s: unhealthy since before this start (%s, XID %d, %s)",
                        uuid, cls.value, record.xid, record.phase)  # fmt: skip

    def bind_loop(self) -> None:
        """Remember the running loop (for reports from other threads)."""
        self._loop = asyncio.get_running_loop()

    def set_devices(self, pools: Mapping[str, Iterable[Device]]) -> None:
        """The devices of each pool now (after a scan); on the loop.

        A GPU with a record keeps it while it is away (a re-plug is no
        repair); one that comes back outside a reset of ours, of a class a
        reset cures, was reset by its unplug: it goes to the health check.
        """
        new = {p: tuple(ds) for p, ds in pools.items()}
        if new == self._pools:
            return
        self._pools = new
        present = {u for ds in new.values() for d in ds if (u := gpu_of(d))}
        for uuid, record in self.records.data.gpus.items():
            if uuid not in present:
                self._away.add(uuid)
            elif uuid in self._away:
                self._away.discard(uuid)
                cured = failure_class(record) in (FailureClass.RESET, FailureClass.REBOOT)
                if cured and not record.fabric and record.phase != Phase.RESETTING:
                    record.phase, record.reason = Phase.CHECKING, ""
                    record.add("replugged", "the GPU came back: checking it")
                    self.records.put(uuid, record)
                    if self.on_record is not None:
                        self.on_record(uuid)
            if not record.fabric and (bus_id := self._fabric_bus_id(uuid)) is not None:
                record.fabric, record.bus_id = True, bus_id  # recorded by an older build
                self.records.put(uuid, record)
        self._notify(health_changed=False)

    def gpus(self) -> list[str]:
        """UUIDs of the GPUs to watch."""
        return sorted({d.local_id for ds in self._pools.values() for d in ds if d.kind == "gpu"})

    def names(self, uuid: str) -> list[str]:
        return [d.name for ds in self._pools.values() for d in ds if gpu_of(d) == uuid]

    def record(self, uuid: str) -> GpuRecord | None:
        return self.records.get(uuid)

    def unhealthy(self) -> dict[str, GpuRecord]:
        return dict(self.records.data.gpus)

    def fabric_gpus(self) -> dict[str, str]:
        """UUID -> PCI address of each fabric GPU with a record (where its detach shows)."""
        return {u: r.bus_id for u, r in self.records.data.gpus.items() if r.fabric}

    def _fabric_bus_id(self, uuid: str) -> str | None:
        """The PCI address of ``uuid`` if a fabric adapter brought it, else None."""
        for d in (d for ds in self._pools.values() for d in ds):
            if d.kind == "gpu" and d.local_id == uuid and d.attributes.get(ATTACHMENT) == "fabric":
                return str(d.attributes.get(PCI_BUS_ID) or "")
        return None

    def report_xid(self, uuid: str, xid: int) -> None:
        """An XID from NVML; thread-safe (reads the GPU's condition here)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        condition = self._condition(uuid) if self._condition is not None else None
        cls = classify(xid, condition)
        if self._loop is not None and running is not self._loop:
            self._loop.call_soon_threadsafe(self._take, uuid, xid, cls)
        else:
            self._take(uuid, xid, cls)

    def handed_over(self, uuid: str, away: bool) -> None:
        """The plugin hands ``uuid`` to vfio-pci (``away``) or has it back; thread-safe.

        While it is away NVML does not list it, which the XID watcher reports
        as XID 79 (fell off the bus): that one is no failure."""
        if away:
            self._handed_over.add(uuid)
        else:
            self._handed_over.discard(uuid)

    def _take(self, uuid: str, xid: int, cls: FailureClass) -> None:
        if xid == XID_FALLEN_OFF_BUS and uuid in self._handed_over:
            log.info("GPU %s: gone from NVML while handed to vfio-pci (not a failure)", uuid,
                     extra={"device": uuid})  # fmt: skip
            return
        if xid == XID_FALLEN_OFF_BUS and self.leaving is not None and self.leaving(uuid):
            log.info("GPU %s: gone from NVML, a fabric detach (no claim held it): not a failure",
                     uuid, extra={"device": uuid})  # fmt: skip
            return
        if cls is FailureClass.APPLICATION:
            log.info("GPU %s: XID %d (application error, device stays healthy)", uuid, xid,
                     extra={"device": uuid})  # fmt: skip
            return
        names = self.names(uuid)
        old = self.records.get(uuid)
        if old is not None:
            self._again(uuid, old, xid, cls)
            return
        log.error("GPU %s: critical XID %d (%s class): marked unhealthy", uuid, xid, cls.value,
                  extra={"device": ",".join(names) or uuid})  # fmt: skip
        record = GpuRecord.model_validate(
            {"class": cls.value, "xid": xid, "since": time.time(), "boot": self.boot_id}
        )
        effect = self.settings.taint_effect(cls)
        bus_id = self._fabric_bus_id(uuid)
        if bus_id is not None:  # the controller's to detach: never reset here
            record.fabric, record.bus_id = True, bus_id
        where = ", a fabric GPU" if record.fabric else ""
        record.add("unhealthy", f"XID {xid}, {cls.value} class, {effect} taint{where}")
        self.records.put(uuid, record)
        GPU_FAILURES.labels(cls.value).inc()
        note = (f"GPU {uuid} reported critical XID {xid} ({cls.value} class): "
                f"{', '.join(names) or uuid} unhealthy, published with a {effect} taint "
                f"({TAINT_KEY})")  # fmt: skip
        self.warn(DEVICE_UNHEALTHY, note)
        self._notify(uuid)

    def _again(self, uuid: str, record: GpuRecord, xid: int, cls: FailureClass) -> None:
        """Another critical XID of a GPU already unhealthy."""
        before = failure_class(record)
        record.failure_class = worst(before, cls).value
        if record.phase in (Phase.CHECKING, Phase.RESETTING):
            record.phase, record.reason, record.xid = Phase.FAILED, FAILED_AFTER_RESET, xid
            record.add(FAILED_AFTER_RESET, f"XID {xid} after the reset: stays tainted")
            note = f"GPU {uuid} reported XID {xid} again after its reset: stays tainted"
            self.warn("GpuFailedAfterReset", note)
        elif failure_class(record) is not before:
            record.xid = xid
            record.add("reclassed", f"XID {xid}: now {record.failure_class} class")
        else:
            return
        self.records.put(uuid, record)
        self._notify(uuid)

    def detached(self, uuid: str) -> None:
        """A fabric GPU with a record left the node (the controller detached it):
        its record ends here; the fabric pool keeps its failure from now on."""
        if uuid not in self.fabric_gpus():
            return
        self.records.end(uuid, DETACHED, "detached: its failure is the fabric pool's now")
        self._away.discard(uuid)
        log.info("GPU %s: fabric GPU detached, its health record ends", uuid,
                 extra={"device": uuid})  # fmt: skip
        self._notify(uuid)

    def update(self, uuid: str, record: GpuRecord) -> None:
        """A recovery step changed the record (saved at once); on the loop."""
        self.records.put(uuid, record)
        self._notify(uuid)

    def mark_healthy(self, uuid: str, note: str) -> None:
        """The health check passed: the GPU's record goes, its taint with it."""
        self.records.heal(uuid, note)
        log.info("GPU %s healthy again: %s", uuid, note, extra={"device": uuid})
        self._notify(uuid)

    def warn(self, reason: str, note: str) -> None:
        if self.events is not None:
            self.events.warning(reason, "HealthCheck", note)

    def tell(self, reason: str, note: str) -> None:
        if self.events is not None:
            self.events.normal(reason, "HealthCheck", note)

    def _notify(self, uuid: str | None = None, health_changed: bool = True) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        if health_changed and self.on_change is not None:
            self.on_change()
        if uuid is not None and self.on_record is not None:
            self.on_record(uuid)

    def tainted(self, devices: Iterable[Device]) -> list[Device]:
        """``devices`` with a taint on those of an unhealthy GPU (its class's effect)."""
        out = []
        for d in devices:
            record = self.records.get(gpu_of(d) or "")
            if record is not None:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.since))
                effect = self.settings.taint_effect(failure_class(record))
                taint = DeviceTaint(TAINT_KEY, taint_value(record), effect, stamp)
                d = dataclasses.replace(d, taints=(*d.taints, taint))
            out.append(d)
        return out

    def snapshot(self) -> list[DeviceHealth]:
        out = []
        for pool, devices in sorted(self._pools.items()):
            for d in devices:
                r = self.records.get(gpu_of(d) or "")
                if r is None:
                    out.append(DeviceHealth(pool, d.name, HealthStatus.HEALTHY, self._since))
                    continue
                why = f"GPU reported critical XID {r.xid} ({r.failure_class} class, {r.phase})"
                if r.phase == Phase.FAILED and r.reason:
                    why += f": {r.reason}"
                status = HealthStatus.UNHEALTHY
                out.append(DeviceHealth(pool, d.name, status, int(r.since), 0, why))
        return out

    async def updates(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        while True:
            changed = self._changed
            yield self.snapshot()
            await changed.wait()
