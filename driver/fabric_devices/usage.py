"""When the node asks NVML whether its fabric GPUs are in use.

Why: the controller detaches a fabric GPU once no claim holds it and the
node's report (``driver.fabric_devices.node``) does not call it busy. Claims
are known at once; a MIG instance or a process on the GPU only through NVML
(``driver.gpu.usage``), whose calls block and whose processes come and go
without an event. So this task probes in a worker thread:

- at once when a GPU stops being held by any claim. Until that probe
  answers, the GPU stays busy: a "free" from before the release could let
  the controller detach it under a process that outlived its claim;
- every ``interval`` while an attached fabric GPU is held by no claim (a
  warm spare, or a released GPU whose detach waits for a process);
- never on a node whose fabric GPUs are all held by claims (busy anyway),
  or that has none.

A GPU newly attached and not yet held is probed too, but reported free
meanwhile: calling it busy would hide a fresh warm spare from the controller.

Concurrency: :meth:`FabricUsage.busy` runs on the loop with every report;
:meth:`FabricUsage.run` is one task of the plugin's group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial

from driver.devices.kind import DeviceType
from driver.gpu.kind import GpuType
from driver.gpu.usage import gpus_in_use

log = logging.getLogger(__name__)

Probe = Callable[[Collection[str]], Mapping[str, str]]  # blocking: UUIDs -> why in use
INTERVAL_S = 5.0


def nvml_probe(types: Sequence[DeviceType]) -> Probe | None:
    """The NVML probe of the plugin's GPU family, None when it has none."""
    for t in types:
        if isinstance(t, GpuType) and t.nvml is not None:
            return partial(gpus_in_use, t.nvml, t.nvml_lock)
    return None


class FabricUsage:
    """The fabric GPUs NVML shows in use, kept fresh by :meth:`run`."""

    def __init__(self, probe: Probe, interval: float = INTERVAL_S) -> None:
        self._probe = probe
        self.interval = interval
        self.on_change: Callable[[], None] | None = None  # a probe changed the answer
        self._in_use: dict[str, str] = {}
        self._held: set[str] = set()
        self._idle: set[str] = set()  # attached, held by no claim: what a probe asks about
        self._unconfirmed: set[str] = set()  # released, no probe since: busy
        self._checking: set[str] = set()  # unconfirmed ones the running probe started after
        self._wake = asyncio.Event()

    def busy(self, attached: Collection[str], held: Collection[str]) -> set[str]:
        """The fabric GPUs (UUIDs) to report busy besides those claims hold,
        given the ``attached`` ones and those a claim ``held`` whole or in part."""
        attached, held = set(attached), set(held) & set(attached)
        idle = attached - held
        released = self._held - held
        if released & idle:
            self._unconfirmed |= released & idle
            self._checking -= released  # released again while a probe runs: not its answer
        if released & idle or idle - self._idle:
            self._wake.set()
        self._held, self._idle = held, idle
        self._unconfirmed &= idle
        return (set(self._in_use) | self._unconfirmed) & idle

    async def run(self) -> None:
        """Probe whenever :meth:`busy` asks, and every ``interval`` while a GPU is idle."""
        while True:
            if self._idle:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
            else:
                await self._wake.wait()
            self._wake.clear()
            await self.probe_once()

    async def probe_once(self) -> None:
        """Ask NVML about the idle GPUs now; ``on_change`` if the answer changed."""
        idle, self._checking = sorted(self._idle), set(self._unconfirmed)
        found = dict(await asyncio.to_thread(self._probe, idle)) if idle else {}
        checking, self._checking = self._checking, set()
        for uuid in found.keys() - self._in_use.keys():
            log.info("fabric GPU %s is in use (%s): reported busy", uuid, found[uuid])
        for uuid in self._in_use.keys() - found.keys():
            log.info("fabric GPU %s is no longer in use", uuid)
        changed = found.keys() != self._in_use.keys() or bool(checking & self._unconfirmed)
        self._in_use = found
        self._unconfirmed -= checking
        if changed and self.on_change is not None:
            self.on_change()
