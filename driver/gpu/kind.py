"""Full GPUs (and, when enabled, their MIG partitions) as a
:class:`driver.devices.kind.DeviceType`.

With dynamic MIG on (``mig`` given) the same scan also yields the counter
sets and partition devices, under the NVML session lock so that no scan
sees a MIG change halfway (``driver.mig.session``). GPUs an operator marks
shareable are also published as fractional GPUs (``driver.gpu.fraction``),
and with ``--compatibility-groups`` the modes say so (``driver.gpu.modes``).
Full GPUs can be handed to a VM (``driver.gpu.passthrough``); this module
gives that the NVML view of MIG it refuses on.
The MIG family builds
on this one (its handler reuses :class:`GpuHandler`), so this module sees it
only through the :class:`Partitions` protocol.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.gpu.discovery import Place
from driver.gpu.fraction import KIND as SHARED
from driver.gpu.fraction import SharePolicy, with_shared
from driver.gpu.hami import SharedGpuHandler, ShareGuard
from driver.gpu.modes import with_compatibility_groups
from driver.gpu.passthrough import GpuPassthrough
from driver.gpu.prepare import GpuHandler
from driver.gpu.scan import FullGpus, GpuSource, SysfsTopology, devices_of, scan_gpus
from driver.health.xid import XidWatcher

if TYPE_CHECKING:
    from driver.nvml.backend import NvmlBackend


class Partitions(Protocol):
    """Dynamic MIG on top of the full GPUs (``driver.mig.discovery.MigSupport``)."""

    @property
    def lock(self) -> threading.RLock:
        """The NVML session lock that scans, MIG changes and XID waits share."""

    @property
    def guard(self) -> ShareGuard: ...
    @property
    def handler(self) -> DeviceHandler: ...
    def discover(self, full_gpus: FullGpus) -> Discovery:
        """One scan: enumerate NVML once, turn it into full-GPU devices with
        ``full_gpus``, and add the partitions."""
        ...


class GpuType:
    def __init__(
        self,
        source: GpuSource,
        sysfs_root: Path,
        dev_root: Path,
        mig: Partitions | None = None,
        events: NvmlBackend | None = None,
        share: SharePolicy | None = None,
        hami_library: Path | None = None,
        state_dir: Path | None = None,
        compatibility_groups: bool = False,
        placement: Callable[[str], Place] | None = None,
    ) -> None:
        self._source = source
        self._groups = compatibility_groups  # one mode per GPU as KEP-5963 groups
        self._events = events
        self._topology = SysfsTopology(sysfs_root, placement)  # local GPUs named first
        self._mig = mig
        self.passthrough = GpuPassthrough(sysfs_root, dev_root, mig_refusal=self._mig_refusal)
        self._handler = GpuHandler(
            dev_root, guard=mig.guard if mig else None, passthrough=self.passthrough
        )
        self._share = share if share is not None and share.enabled else None
        self._shares = (
            SharedGpuHandler(
                GpuHandler(dev_root), hami_library, state_dir, mig.guard if mig else None
            )
            if self._share is not None
            else None
        )

    def discover(self) -> Discovery:
        if self._mig is None:
            found = Discovery(devices=tuple(scan_gpus(self._source, self._topology)))
        else:
            with self._mig.lock:
                found = self._mig.discover(partial(devices_of, topology=self._topology))
        found = found if self._share is None else with_shared(found, self._share)
        return with_compatibility_groups(found) if self._groups else found

    def _mig_refusal(self, uuid: str) -> str | None:
        """Why NVML says ``uuid`` cannot leave its driver (MIG), None when it can."""
        nvml = self._events
        if nvml is None:
            return None
        with self._mig.lock if self._mig is not None else contextlib.nullcontext():
            nvml.init()
            try:
                gpu = nvml.gpu(uuid)
                if gpu is None or not gpu.mig_mode_current:
                    return None
                instances = len({i.gi_id for i in nvml.mig_instances(uuid)})
            finally:
                nvml.shutdown()
        if instances:
            return f"it holds {instances} MIG instances; release them first"
        return "it is in MIG mode; an operator must end MIG mode first"

    def xid_watcher(self, on_xid: Callable[[str, int], None]) -> XidWatcher | None:
        """A watcher of these GPUs' XIDs (None without an event source); not started."""
        if self._events is None:
            return None
        lock = self._mig.lock if self._mig is not None else None
        return XidWatcher(self._events, on_xid, lock)

    @property
    def nvml(self) -> NvmlBackend | None:
        """The NVML backend changes go through (GPU sharing), None without one."""
        return self._events

    @property
    def nvml_lock(self) -> threading.RLock | None:
        """The NVML session lock of dynamic MIG, None without MIG."""
        return self._mig.lock if self._mig is not None else None

    def handlers(self) -> Mapping[str, DeviceHandler]:
        out: dict[str, DeviceHandler] = {"gpu": self._handler}
        if self._mig is not None:
            out["mig"] = self._mig.handler
        if self._shares is not None:
            out[SHARED] = self._shares
        return out
