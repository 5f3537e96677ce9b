"""The health of the plugin's devices, from GPU XID events (KEP-4680).

Why: a GPU that reports a critical XID (fell off the bus, double-bit ECC,
row-remap failure, ...) keeps running pods that can no longer trust it. The
kubelet's ``DRAResourceHealth`` stream puts each device's health into the
status of the pods using it. This module keeps the complete list: every
device of the plugin's pools, ``HEALTHY`` until its GPU (a MIG device's
parent GPU) reports a critical XID, then ``UNHEALTHY`` with the XID in the
message. VFs have no health source yet and stay ``HEALTHY``. A GPU that
leaves the node (hot-unplug) leaves the list; one that comes back starts
healthy again (the XID is the hardware's verdict until a reset or re-plug).
The plugin also publishes an unhealthy GPU and its MIG devices with a
``NoSchedule`` taint (``DRADeviceTaints``), so the scheduler stops handing
them out while the pods already using them keep running.

Concurrency: lives on the plugin's asyncio loop. :meth:`report_xid` may be
called from any thread (it hops onto the loop); several kubelet streams can
iterate :meth:`updates` at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence

from driver.devices.model import Device, DeviceTaint
from driver.health.model import DeviceHealth, HealthStatus
from driver.kube.events import ObjectEvents

log = logging.getLogger(__name__)

# Application-level XIDs (bad memory access by a program, graphics engine
# exceptions, ...): the GPU itself is fine. Everything else is critical, as in
# NVIDIA's own device plugin.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
TAINT_KEY = "patchbay.dev/unhealthy"
DEVICE_UNHEALTHY = "DeviceUnhealthy"  # the Event reason on the Node (docs/events.md)


def gpu_of(device: Device) -> str | None:
    """The UUID of the GPU whose health decides this device's, if any."""
    if device.kind == "gpu":
        return device.local_id
    own = device.attributes.get("uuid")
    if isinstance(own, str) and own == device.local_id:
        return own  # another view of a whole GPU: its fractional twin (driver.gpu.fraction)
    return device.parent if device.kind == "mig" else None


class HealthMonitor:
    """The latest health list of every device, and a change signal."""

    def __init__(self) -> None:
        self._pools: dict[str, tuple[Device, ...]] = {}
        self._bad: dict[str, tuple[int, int]] = {}  # GPU UUID -> (XID, unix time)
        self._since = int(time.time())
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # On the loop, after an XID changed a device's health (not after
        # set_devices: the scan that called it publishes anyway).
        self.on_change: Callable[[], None] | None = None
        self.events: ObjectEvents | None = None  # the Node's, once the plugin knows it

    def bind_loop(self) -> None:
        """Remember the running loop (for reports from other threads)."""
        self._loop = asyncio.get_running_loop()

    def set_devices(self, pools: Mapping[str, Iterable[Device]]) -> None:
        """The devices of each pool now (after a scan); on the loop."""
        new = {p: tuple(ds) for p, ds in pools.items()}
        if new == self._pools:
            return
        self._pools = new
        present = {u for ds in new.values() for d in ds if (u := gpu_of(d))}
        for uuid in set(self._bad) - present:
            del self._bad[uuid]  # unplugged: a device that comes back starts afresh
        self._notify(health_changed=False)

    def gpus(self) -> list[str]:
        """UUIDs of the GPUs to watch."""
        return sorted({d.local_id for ds in self._pools.values() for d in ds if d.kind == "gpu"})

    def report_xid(self, uuid: str, xid: int) -> None:
        """An XID from NVML; thread-safe."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is not None and running is not self._loop:
            self._loop.call_soon_threadsafe(self._take, uuid, xid)
        else:
            self._take(uuid, xid)

    def _take(self, uuid: str, xid: int) -> None:
        if xid in APPLICATION_XIDS:
            log.info("GPU %s: XID %d (application error, device stays healthy)", uuid, xid,
                     extra={"device": uuid})  # fmt: skip
            return
        if uuid in self._bad:
            return
        names = [d.name for ds in self._pools.values() for d in ds if gpu_of(d) == uuid]
        log.error("GPU %s: critical XID %d: marked unhealthy", uuid, xid,
                  extra={"device": ",".join(names) or uuid})  # fmt: skip
        self._bad[uuid] = (xid, int(time.time()))
        if self.events is not None:
            note = (f"GPU {uuid} reported critical XID {xid}: {', '.join(names) or uuid} "
                    f"unhealthy, published with a NoSchedule taint ({TAINT_KEY})")  # fmt: skip
            self.events.warning(DEVICE_UNHEALTHY, "HealthCheck", note)
        self._notify()

    def _notify(self, health_changed: bool = True) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        if health_changed and self.on_change is not None:
            self.on_change()

    def tainted(self, devices: Iterable[Device]) -> list[Device]:
        """``devices`` with a ``NoSchedule`` taint on those of an unhealthy GPU."""
        out = []
        for d in devices:
            bad = self._bad.get(gpu_of(d) or "")
            if bad is not None:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(bad[1]))
                taint = DeviceTaint(TAINT_KEY, f"xid-{bad[0]}", "NoSchedule", stamp)
                d = dataclasses.replace(d, taints=(*d.taints, taint))
            out.append(d)
        return out

    def snapshot(self) -> list[DeviceHealth]:
        out = []
        for pool, devices in sorted(self._pools.items()):
            for d in devices:
                bad = self._bad.get(gpu_of(d) or "")
                if bad is None:
                    out.append(DeviceHealth(pool, d.name, HealthStatus.HEALTHY, self._since))
                else:
                    why = f"GPU reported critical XID {bad[0]}"
                    out.append(DeviceHealth(pool, d.name, HealthStatus.UNHEALTHY, bad[1], 0, why))
        return out

    async def updates(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        while True:
            changed = self._changed
            yield self.snapshot()
            await changed.wait()
