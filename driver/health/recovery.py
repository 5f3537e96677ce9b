"""Recovery of an unhealthy GPU on the node: reset, check, publish healthy.

Why: a GPU whose failure a reset cures stayed tainted until a reset nobody
performed. Each GPU with a health record (:mod:`driver.health.records`)
moves through its phases here, every step saved before it is taken and told
as an Event on the Node:

``tainted`` -> (no prepared claim uses it, policy allows, under the reset
limit, no process holds it) ``resetting`` -> (nvidia-smi reset it; the MIG
mode it had is restored) ``checking`` -> (NVML check passes: recovery action
none, no pending or failed row remap, no uncorrectable ECC; then no new
critical XID for the settle window, then the check again) healthy: the
record goes and with it the taint. A failed reset, a failed check, a new
critical XID while checking (the monitor sees it) or the reset limit makes
the phase ``failed``: the GPU stays tainted with the reason in its taint
value, and nothing retries it (no loop); an operator's reboot or
replacement ends it. A reset refused because a process holds the GPU goes
back to ``tainted`` and is retried.

Crash safety: a plugin that dies in ``resetting`` resets again after the
restart (finishing what it started; a reset of a reset GPU is harmless),
unless a claim was prepared on the GPU meanwhile (then back to ``tainted``);
one that dies in ``checking`` checks again. Nothing is published healthy
without a passing check, and nothing is reset while a prepared claim uses it:
the claim preparer's lock is held from the last look through the reset.

A GPU a fabric adapter brought is never reset or checked here, whatever
its class: the controller detaches it once its pods are gone and holds it
out of its pool (docs/health.md, "The fabric path"); a reset racing that
detach would hot-remove a GPU under ``nvidia-smi``, and a GPU published
healthy here would end the failure the fabric pool keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from driver.errors import PatchbayError
from driver.health.monitor import HealthMonitor, failure_class
from driver.health.policy import HealthSettings
from driver.health.records import GpuRecord, Phase
from driver.health.reset import GpuOps, ResetOutcome
from driver.metrics import GPU_RECOVERY_SECONDS, GPU_RESETS

log = logging.getLogger(__name__)

TICK_S = 30.0  # how often waiting GPUs are looked at again without a wake-up


class GpuRecovery:
    def __init__(
        self,
        monitor: HealthMonitor,
        settings: HealthSettings,
        ops: GpuOps,
        in_use: Callable[[str], bool],
        claim_lock: contextlib.AbstractAsyncContextManager[Any] | None = None,
    ) -> None:
        self.monitor = monitor
        self.settings = settings
        self.ops = ops
        self.in_use = in_use  # whether a prepared claim holds the GPU (or one of its devices)
        # Held from the last in_use look through the reset: no claim is prepared
        # on the GPU meanwhile (the claim preparer's lock, driver.claims.lock).
        self.claim_lock = claim_lock if claim_lock is not None else contextlib.nullcontext()
        self._wake = asyncio.Event()
        self._said: dict[str, str] = {}  # the last waiting reason told, per GPU (no repeats)
        self._busy: set[str] = set()  # GPUs a step runs for (one at a time per GPU)
        self._settling: dict[str, asyncio.Event] = {}  # set when that GPU's record changes
        self._passes: set[asyncio.Task[None]] = set()

    def wake(self, uuid: str | None = None) -> None:
        """Look again soon (a record changed, a claim was unprepared); on the loop."""
        self._wake.set()
        if uuid is not None and uuid in self._settling:
            self._settling[uuid].set()

    def claims_changed(self) -> None:
        """A claim was prepared or unprepared: look again if a GPU has a
        health record (one may wait for its claims to go). With none, a pass
        finds nothing: waking for it would cost every prepare and unprepare a
        task, a gather and a wait_for (issue 36). A record made later wakes
        the recovery itself (``HealthMonitor.on_record``)."""
        if self.monitor.unhealthy():
            self.wake()

    async def run(self) -> None:
        """Passes on every wake-up and tick; a GPU settling does not hold up another."""
        try:
            while True:
                self._wake.clear()
                task = asyncio.create_task(self.pass_once())
                self._passes.add(task)
                task.add_done_callback(self._passes.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), TICK_S)
        finally:
            for task in list(self._passes):
                task.cancel()

    async def pass_once(self) -> None:
        """One look at every unhealthy GPU no step runs for yet, concurrently."""
        uuids = [u for u in sorted(self.monitor.unhealthy()) if u not in self._busy]
        await asyncio.gather(*(self._one(u) for u in uuids))

    async def _one(self, uuid: str) -> None:
        self._busy.add(uuid)
        try:
            await self.step(uuid)
        except PatchbayError as exc:  # NVML trouble: try again on the next pass
            log.warning("GPU %s: recovery step failed (retrying): %s", uuid, exc)
        finally:
            self._busy.discard(uuid)

    async def step(self, uuid: str) -> None:
        record = self.monitor.record(uuid)
        if record is None or record.fabric:
            return  # a fabric GPU is the controller's to detach: never reset here
        if record.phase == Phase.TAINTED:
            await self._maybe_reset(uuid, record)
        elif record.phase == Phase.RESETTING:
            await self._reset(uuid, record)
        elif record.phase == Phase.CHECKING:
            await self._check(uuid, record)

    def _wait(self, uuid: str, why: str, note: str) -> None:
        if self._said.get(uuid) != why:
            self._said[uuid] = why
            self.monitor.tell("GpuResetWaiting", f"GPU {uuid}: reset waits: {note}")

    def _fail(self, uuid: str, record: GpuRecord, reason: str, note: str) -> None:
        record.phase, record.reason = Phase.FAILED, reason
        record.add(reason, note)
        self.monitor.update(uuid, record)
        self.monitor.warn("GpuRecoveryFailed", f"GPU {uuid}: {note}: stays tainted ({reason})")

    async def _maybe_reset(self, uuid: str, record: GpuRecord) -> None:
        if not self.settings.may_reset(failure_class(record)):
            return  # reboot or replace class, or resets are off: the taint stays
        if self.in_use(uuid):
            self._wait(uuid, "claims", "a prepared claim still uses it")
            return
        now = time.time()
        limit, window = self.settings.gpu_reset_limit, self.settings.gpu_reset_window
        if self.monitor.records.resets_within(uuid, window, now) >= limit:
            self._fail(uuid, record, "reset-limit",
                       f"{limit} resets within {window:.0f} s already")  # fmt: skip
            return
        holders = await asyncio.to_thread(self.ops.processes, uuid)
        if holders:
            self._wait(uuid, "processes", f"processes {holders} hold it")
            return
        record.mig = await asyncio.to_thread(self.ops.mig_mode, uuid)
        self.monitor.records.note_reset(uuid, now, window)
        record.phase, record.reason = Phase.RESETTING, ""
        record.add("resetting", "no claim uses it: resetting")
        self.monitor.update(uuid, record)  # saved before the reset: a crash resumes here
        self.monitor.tell("GpuResetStarted", f"GPU {uuid}: no claim uses it: resetting it")
        await self._reset(uuid, record)

    async def _reset(self, uuid: str, record: GpuRecord) -> None:
        async with self.claim_lock:
            if self.in_use(uuid):  # a claim was prepared since (a crash between save and reset)
                record.phase = Phase.TAINTED
                record.add("reset-undone", "a claim uses it again: reset not done")
                self.monitor.update(uuid, record)
                return
            bus_id = await asyncio.to_thread(self.ops.bus_id, uuid)
            if bus_id is None:
                self._fail(uuid, record, "reset-failed", "NVML no longer finds it")
                GPU_RESETS.labels(result="failed").inc()
                return
            self._said.pop(uuid, None)
            GPU_RESETS.labels(result="tried").inc()
            result = await asyncio.to_thread(self.ops.reset, uuid, bus_id)
        if record.phase != Phase.RESETTING:
            return  # a new XID failed it meanwhile (the monitor recorded why)
        if result.outcome is ResetOutcome.IN_USE:
            self.monitor.records.unnote_reset(uuid)  # not a reset: the limit does not count it
            record.phase = Phase.TAINTED
            record.add("reset-refused", result.message)
            self.monitor.update(uuid, record)
            self._wait(uuid, "in-use", f"nvidia-smi refused: {result.message}")
            GPU_RESETS.labels(result="refused").inc()
            return
        if result.outcome is ResetOutcome.FAILED:
            GPU_RESETS.labels(result="failed").inc()
            self._fail(uuid, record, "reset-failed", f"the reset failed: {result.message}")
            return
        GPU_RESETS.labels(result="succeeded").inc()
        record.phase = Phase.CHECKING
        record.add("reset", "reset done: checking it")
        self.monitor.update(uuid, record)
        self.monitor.tell("GpuReset", f"GPU {uuid} was reset: checking it")
        await self._check(uuid, record)

    async def _check(self, uuid: str, record: GpuRecord) -> None:
        if record.mig is not None:
            now = await asyncio.to_thread(self.ops.mig_mode, uuid)
            if now is not None and now != record.mig:
                await asyncio.to_thread(self.ops.set_mig_mode, uuid, record.mig)
                record.add("mig-restored", f"MIG mode {'on' if record.mig else 'off'} again")
                self.monitor.update(uuid, record)
        problems = (await asyncio.to_thread(self.ops.condition, uuid)).problems()
        if record.phase != Phase.CHECKING:
            return
        if problems:
            self._fail(uuid, record, "check-failed", "health check: " + ", ".join(problems))
            return
        await self._settle(uuid)
        after = self.monitor.record(uuid)
        if after is None or after.phase != Phase.CHECKING:
            return  # failed again while settling (the monitor recorded it) or gone
        problems = (await asyncio.to_thread(self.ops.condition, uuid)).problems()
        if after.phase != Phase.CHECKING:
            return
        if problems:
            self._fail(uuid, after, "check-failed", "health check: " + ", ".join(problems))
            return
        since = time.time() - after.since
        GPU_RECOVERY_SECONDS.observe(since)
        self.monitor.mark_healthy(uuid, f"check passed {since:.0f} s after the failure")
        self.monitor.tell("GpuHealthy", f"GPU {uuid} passed its health check: published healthy")

    async def _settle(self, uuid: str) -> None:
        """The settle window; it ends early when the GPU's record changes (a
        new critical XID fails it: the monitor records that)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.gpu_health_settle
        changed = self._settling[uuid] = asyncio.Event()
        try:
            while (r := self.monitor.record(uuid)) is not None and r.phase == Phase.CHECKING:
                left = deadline - loop.time()
                if left <= 0:
                    return
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        finally:
            self._settling.pop(uuid, None)
