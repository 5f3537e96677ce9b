"""Attach and detach operations, one asyncio task per fabric device.

Why: attaching takes seconds to minutes on real fabric managers, so each
operation runs as its own task while the reconciler keeps reacting. Keying
the tasks by fabric device makes operations on one device strictly
sequential (a detach of the previous holder finishes before the next
attach starts). How one attach is asked and followed is the
fabric's attach model (``driver.controller.attach.model``: once per
allocation, retried while the device leaves another node, the fabric is
unreachable or a resource it needs is broken). Every failure ends in
``FabricDeviceFailed`` with its case as the reason
(``driver.controller.attach.cases``): a refused attach (4xx, a foreign
tenant) or a failed one (its task, the timeout) also holds the device; an
unreachable fabric or a broken resource, once the budget is spent, holds
nothing. Each new error an attach waits out is an Event on the claim
whose reason is its case, and a broken resource met outside a read is
counted by cause (``patchbay_fabric_unreadable_resources_total``, as the
client's reads count theirs). A failed or refused
detach is asked again by a later pass once its device's backoff allows
(``driver.controller.attach.retries``: exponential, jittered, capped), and its
DetachFailed Event carries the fabric's message (which names the
connection in the way).

The reconciler decides to detach (and the spare keeper to attach) from its
last fabric inventory, and an operation's end triggers a pass at once, often
before the re-read it asked for is in: that inventory still shows the device
as it was. A device therefore stays *settling* from its operation's end
until an inventory requested after that end is in hand
(:meth:`Workers.inventory_read`); nothing new starts on it meanwhile, so
one detach is asked (and counted) once. That, and an outcome written to a
claim the claims cache does not show yet, are the workers' expectations
(``driver.controller.attach.expectations``).

The workers know nothing of the reconciler: they get the fabric client,
the claim-status writer, the node reports (whose change signal ends the
wait for the node to see an attached device), the failed-device holds and
a callback for when an operation ends (the reconciler re-reads the fabric
and makes a pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from driver.controller import claims as cl
from driver.controller.attach import cases
from driver.controller.attach.connect import Connector
from driver.controller.attach.device_attach import DeviceAttach
from driver.controller.attach.expectations import Expectations
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.memdevs import MemdevArrivals
from driver.controller.attach.model import AttachModel
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.retries import Retries
from driver.controller.attach.slot_attach import SlotAttach
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.events import ControllerEvents, claim_ref
from driver.controller.pool.variant import Variant
from driver.errors import (
    AdapterFull,
    ApiError,
    AttachFailed,
    FabricApiError,
    FabricResourceBroken,
    FabricUnavailable,
    PatchbayError,
    SpareTaken,
)
from driver.fabric_devices.holds import held_for
from driver.fabric_devices.naming import READY_CONDITION
from driver.fabricclient.links import cause_of
from driver.fabricclient.protocol import FabricApi
from driver.kube.events import ObjectRef
from driver.logconfig import bind_log_context
from driver.metrics import FABRIC_IN_FLIGHT, FABRIC_OPS, FABRIC_SECONDS, FABRIC_UNREADABLE

log = logging.getLogger(__name__)


def observe(op: str, result: str, started: float) -> None:
    """An operation ended: count it and its duration (``driver.metrics``)."""
    FABRIC_OPS.labels(op=op, result=result).inc()
    FABRIC_SECONDS.labels(op=op, result=result).observe(time.monotonic() - started)


class Workers:
    def __init__(
        self,
        fabric: FabricApi,
        status: ClaimStatusWriter,
        reports: NodeReports,
        holds: FailedHolds,
        attach_timeout: float,
        on_done: Callable[[], None],
        events: ControllerEvents | None = None,
        unreachable_budget: float | None = None,
        published: Callable[[], Awaitable[None]] | None = None,
        retries: Retries | None = None,
    ) -> None:
        self._fabric = fabric
        self._status = status
        self._reports = reports
        self._holds = holds
        self._timeout = attach_timeout
        self._budget = attach_timeout if unreachable_budget is None else unreachable_budget
        connector = Connector(fabric, status, attach_timeout, unreachable_budget, self._trouble)
        self.connector = connector  # its ``theirs``: the reconciler's other hosts
        # Which memdev each attached CXL LD is on its node (attach.memdevs).
        self.memdevs = MemdevArrivals()
        devices = DeviceAttach(connector, reports, self.memdevs)
        self._expect = Expectations()
        # The fabric's pool shape decides how an attach is asked (model.py).
        self._model: AttachModel = (
            SlotAttach(fabric, reports, devices, self._expect.asking, self.memdevs)
            if fabric.picks_devices
            else devices
        )
        self._on_done = on_done
        # Refused detaches, per device: when each may be asked again (a pass then).
        self._retries = retries or Retries(on_done)
        # Awaited after a hold and before the failure is written: the pool
        # without the held device is in the apiserver by then, so the
        # scheduler that clears the failed allocation cannot pick it again.
        self._published = published
        # Operations under way: the task per device, the allocation each
        # attach is for, the devices whose spare attach runs, and the device
        # a count-based manager attached for a spare attach still running
        # (by the device it was asked through).
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._attaching: dict[str, tuple[str, str]] = {}
        self._sparing: set[str] = set()
        self._spare_arrivals: dict[str, str] = {}
        self._events = events or ControllerEvents(None)
        # The claim each device was last attached for: its detach Event goes there.
        self._holder: dict[str, ObjectRef] = {}

    async def stop(self) -> None:
        """Cancel every attach and detach under way and wait for them to end."""
        self._retries.close()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def busy(self, device_id: str) -> bool:
        return (
            device_id in self._tasks
            or self._expect.serving(device_id)
            or device_id in self._spare_arrivals.values()
        )

    def scaling_up(self, node: str) -> bool:
        """Whether a count-based manager's answer for ``node`` is not recorded
        yet: a device attached there that nothing names may be it."""
        return self._expect.scaling_up(node)

    def arriving(self, device_id: str) -> bool:
        """Whether a count-based manager attached ``device_id`` for a spare
        attach that still runs (asked through another device)."""
        return device_id in self._spare_arrivals.values()

    def served(self, a: cl.FabricAllocation) -> str:
        """The device that arrived for ``a``'s slot ("" if none or not known yet)."""
        return a.served or self._expect.arrival((a.claim_uid, a.device))

    def settling(self, device_id: str) -> bool:
        """Whether an operation on ``device_id`` ended after the inventory in
        hand was requested: what that inventory says of the device is stale."""
        return self._expect.settling(device_id)

    def inventory_read(self, requested: float) -> None:
        """The inventory now in hand was requested at ``requested``
        (``time.monotonic``): the operations that ended before then are in it."""
        self._expect.inventory_read(requested)

    def _start(self, device_id: str, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[device_id] = task
        in_flight = FABRIC_IN_FLIGHT.labels(op=name.partition("-")[0])  # attach-<id>, detach-<id>
        in_flight.inc()

        def done(_: asyncio.Task[None]) -> None:
            in_flight.dec()
            if self._tasks.get(device_id) is task:
                del self._tasks[device_id]
                self._attaching.pop(device_id, None)
                self._expect.operation_ended(device_id)  # settling from now on
            self._on_done()

        task.add_done_callback(done)

    def attach(self, a: cl.FabricAllocation, v: Variant) -> None:
        """Attach for allocation ``a`` unless an attach of it runs or has ended."""
        key = (a.claim_uid, a.device)
        if not self.busy(v.device_id) and not self._expect.outcome_pending(key):
            self._attaching[v.device_id] = key
            self._start(v.device_id, self._attach(a, v), f"attach-{v.device_id}")

    def settled(self, a: cl.FabricAllocation) -> bool:
        """Whether the attach of ``a`` ended here and its outcome is written."""
        return self._expect.outcome_pending((a.claim_uid, a.device))

    def forget(self, waiting: set[tuple[str, str]]) -> None:
        """Keep only the settled allocations the claims cache still shows waiting
        (an outcome the cache shows, or an allocation gone, needs no memory)."""
        self._expect.claims_show(waiting)

    def detach(self, device_id: str, node: ObjectRef) -> None:
        """Detach ``device_id`` (attached to ``node``, where its Event goes
        when this incarnation did not attach it for a claim), unless an
        operation on it runs or is settling, or its last detach was refused
        and its backoff has not run out."""
        if not (self.busy(device_id) or self.settling(device_id)) and self._retries.due(device_id):
            self._start(device_id, self._detach(device_id, node), f"detach-{device_id}")

    def attach_spare(self, v: Variant, node: ObjectRef, on_end: Callable[[str], None]) -> bool:
        """Attach ``v``'s device as a warm spare (``driver.controller.spares.policy``):
        the claim's attach path, with a key of its own; False if the device is busy.
        ``on_end(device)`` runs when it ends, cancelled included: the device
        attached as the spare (on a count fabric the one that arrived, not
        ``v``'s), "" if none. False too while an operation on it is settling."""
        if self.busy(v.device_id) or self.settling(v.device_id):
            return False
        self._sparing.add(v.device_id)
        self._start(v.device_id, self._attach_spare(v, node, on_end), f"attach-{v.device_id}")
        return True

    def cancel_spare(self, device_id: str) -> None:
        """Stop a spare's attach under way (a claim needs the device now)."""
        if device_id in self._sparing and device_id in self._tasks:
            log.info("%s is needed by a claim: cancelling its spare attach", device_id)
            self._tasks[device_id].cancel()

    def cancel_unneeded(self, wanted: set[tuple[str, str]]) -> None:
        """Cancel attaches whose allocation disappeared (pod deleted in PreBind)."""
        for device_id, key in list(self._attaching.items()):
            if key not in wanted:
                log.info("allocation %s of claim %s is gone: cancelling its attach", key[1], key[0])
                self._tasks[device_id].cancel()
                self._attaching.pop(device_id, None)

    async def _attach(self, a: cl.FabricAllocation, v: Variant) -> None:
        # Each operation is its own task: these log fields are this attach's alone.
        bind_log_context(claim=f"{a.namespace}/{a.name}", node=v.node, device=v.device_id)
        started = time.monotonic()
        self._holder[v.device_id] = claim_ref(a)
        self._events.attaching(a, v)
        deadline = started + self._timeout
        try:
            if v.full:  # its adapter has no room: nothing is asked of the fabric
                raise AdapterFull(v.why)
            if v.device_id in self._holds:
                raise AttachFailed(self._holds.why(v.device_id))
            arrived = functools.partial(self._arrived, a, v)
            message, data = await self._model.attach(a, v, deadline, self.served(a), arrived)
            cond = cl.condition(READY_CONDITION, "Attached", message, None)
            if await self._status.write(a, cond, data):
                self._expect.outcome_written((a.claim_uid, a.device))
                observe("attach", "ok", started)
                self._events.attached(a, message)
                log.info(
                    "claim %s/%s: %s ready after %.2fs", a.namespace, a.name, message,
                    time.monotonic() - started,
                )  # fmt: skip
        except (AttachFailed, FabricApiError, FabricUnavailable) as exc:
            observe("attach", "failed", started)
            case = cases.case_of(exc)
            log.warning("claim %s/%s: attaching %s failed (%s): %s",
                        a.namespace, a.name, v.name, case, exc)  # fmt: skip
            self._expect.dropped((a.claim_uid, a.device))  # arrived, not kept: detached
            if cases.holds(case):
                self._holds.hold(v.device_id)
            if (cases.holds(case) or case == cases.FULL) and self._published is not None:
                await self._published()  # the hold, or the full node's cut, stored first
            why = self._failure(case, exc, v.device_id)
            self._events.attach_failed(a, v, why, case)
            cond = cl.condition(a.failure_condition, case, why, None)
            with contextlib.suppress(ApiError):  # a slot's device that arrived is gone
                if await self._status.write(a, cond, self._model.failure_data(v)):
                    self._expect.outcome_written((a.claim_uid, a.device))

    def _failure(self, case: str, exc: Exception, device_id: str) -> str:
        """The failure's note and condition message: what happened, what follows
        (a hold in :func:`held_for`'s words, which ``kubectl patchbay fabric`` reads)."""
        what = str(exc) if case == cases.FAILED else f"{cases.MEANING[case]}: {exc}"
        if not cases.holds(case):
            return f"{what}; the device is not held (it is not at fault)"
        return f"{what}; {held_for(device_id, self._holds.seconds)}"

    def _trouble(self, a: cl.FabricAllocation, v: Variant, case: str, exc: Exception) -> None:
        """An attach waits out ``exc`` (``connect``, once per attach and error): the
        claim's Event; counted when it is a broken resource no read counted (the
        client's reads count theirs; a held-back device's error names no URI)."""
        log.warning("claim %s/%s: attaching %s meets %s: %s", a.namespace, a.name,
                    v.device_id, case, exc)  # fmt: skip
        named = isinstance(exc, (FabricApiError, FabricResourceBroken)) and bool(exc.uri)
        cause = cause_of(exc) if isinstance(exc, PatchbayError) else None
        if case == cases.BROKEN and named and cause is not None:
            FABRIC_UNREADABLE.labels(cause).inc()
        if a.name:  # a claim's (a spare has none)
            budget = f"retried for up to {self._budget:g}s in a row"
            why = f"{cases.MEANING[case]}: {exc}; {budget}, the device is not held"
            self._events.attach_trouble(a, v, case, why)

    async def _arrived(self, a: cl.FabricAllocation, v: Variant, device_id: str) -> None:
        """A count-based manager named ``device_id`` for ``a``: this allocation's
        from now on, here and (once written) on the claim, so a restart follows
        it instead of detaching it and asking again (``slot_attach``)."""
        self._expect.arrived((a.claim_uid, a.device), device_id)
        what = f"{device_id} arrived for {v.device_id}: waiting for {v.node} to report it"
        cond = cl.condition(READY_CONDITION, "Attaching", what, None, status="False")
        try:
            await self._status.write(a, cond, {"fabricDevice": device_id})
        except ApiError as exc:  # the take-up after a restart still finds it
            log.info("claim %s/%s: recording %s: %s", a.namespace, a.name, device_id, exc)

    def adopt(self, a: cl.FabricAllocation, device_id: str) -> None:
        """``device_id``, attached to ``a``'s node, serves ``a``'s slot
        (``pool.slot_serving.take_up``): its attach follows it, nothing detaches it."""
        self._expect.arrived((a.claim_uid, a.device), device_id)

    async def _attach_spare(
        self, asked: Variant, node: ObjectRef, on_end: Callable[[str], None]
    ) -> None:
        bind_log_context(node=asked.node, device=asked.device_id)
        started, attached, v = time.monotonic(), "", asked
        # No claim: a key of its own per attach, and nothing recorded on a claim.
        a = cl.FabricAllocation(f"spare-{uuid.uuid4().hex}", "", "", v.name, False, False)
        try:
            if v.device_id in self._holds:
                raise AttachFailed(self._holds.why(v.device_id))
            deadline = started + self._timeout

            def arrived(device_id: str) -> None:
                self._spare_arrivals[asked.device_id] = device_id

            v, deadline = await self._model.attach_spare(a, v, deadline, arrived)
            if not await self._reports.wait_until(
                lambda: self._reports.sees(v.node, v.kind, v.identity, v.adapter), deadline
            ):
                raise AttachFailed(f"node {v.node} did not report {v.kind} {v.identity} in time")
            observe("attach", "ok", started)
            attached = v.device_id
            self._holder[v.device_id] = node
            self._events.spare_attached(node, v)
            log.info("%s attached to %s via %s as a warm spare", v.device_id, v.node, v.adapter)
        except SpareTaken as exc:  # someone else's now: no hold, nothing to fail
            log.info("spare %s not attached: %s", v.device_id, exc)
        except (AttachFailed, FabricApiError, FabricUnavailable) as exc:
            observe("attach", "failed", started)
            case = cases.case_of(exc)
            log.warning("attaching %s as a spare failed (%s): %s", v.name, case, exc)
            if cases.holds(case):
                self._holds.hold(asked.device_id)
            self._events.spare_failed(node, v, self._failure(case, exc, asked.device_id))
        finally:
            self._sparing.discard(asked.device_id)
            got = self._spare_arrivals.pop(asked.device_id, "")
            if got and got != asked.device_id:  # settling too: see inventory_read
                self._expect.operation_ended(got)
            on_end(attached)

    async def _detach(self, device_id: str, node: ObjectRef) -> None:
        bind_log_context(node=node.name, device=device_id)  # this task's own context
        fabric, started = self._fabric, time.monotonic()
        regarding = self._holder.get(device_id, node)
        try:
            task = await fabric.detach(device_id)
            if task is not None:
                done = await fabric.wait(task.uri, self._timeout)
                if done.failed:
                    raise AttachFailed("; ".join(done.messages) or "detach task failed")
                log.info("fabric device %s detached", device_id)
                self._events.detached(regarding, device_id, node.name)
            observe("detach", "ok", started)
            self.memdevs.forget(device_id)
            self._holder.pop(device_id, None)
            self._retries.succeeded(device_id)
        except (FabricApiError, FabricUnavailable, TimeoutError, AttachFailed) as exc:
            observe("detach", "failed", started)
            delay = self._retries.refused(device_id)
            log.info("detaching %s failed (asked again in %.1fs): %s", device_id, delay, exc)
            self._events.detach_failed(regarding, device_id, str(exc))
