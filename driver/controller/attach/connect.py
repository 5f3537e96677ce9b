"""One attach, asked of the fabric once per allocation, followed to its end.

Why apart from ``driver.controller.attach.workers``: the workers decide which
operation runs on which device and what its outcome writes; this is how one
attach gets done against a fabric that may be slow, busy or down. It asks
only when no earlier request for the allocation is under way or done (a
recorded operation handle on the claim, or a connection already on its way
to this node and adapter), so retries and controller restarts cost no
second request; it detaches a device still attached to another node first
(never one on a host that is none of the cluster's nodes: ``theirs``,
``driver.controller.hosts``; that attach fails);
and a fabric that is unreachable, or one of whose resources is broken
(``driver.controller.attach.cases``), is retried with backoff (up to
``RETRY_CAP_S`` between tries), its time not counted against the attach
timeout, until ``unreachable_budget`` seconds in a row; each new error is
told to ``trouble`` (the claim's Event) as it comes. A refused attach is
not retried here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from driver.backoff import Backoff
from driver.controller import claims as cl
from driver.controller.attach import cases
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.pool.variant import Variant
from driver.errors import (
    ApiError,
    AttachFailed,
    FabricApiError,
    FabricConflict,
    FabricNotFound,
    FabricUnavailable,
    SpareTaken,
)
from driver.fabric_devices.naming import READY_CONDITION
from driver.fabricclient.protocol import FabricApi
from driver.faults import crash_point

log = logging.getLogger(__name__)

RETRY_S = 0.5
RETRY_CAP_S = 5.0

# Told of each new error an attach waits out: (allocation, variant, case, error).
Trouble = Callable[[cl.FabricAllocation, Variant, str, Exception], None]


class Connector:
    """Attaches for the workers (``connect``); ``finish`` follows a handle."""

    def __init__(
        self,
        fabric: FabricApi,
        status: ClaimStatusWriter,
        attach_timeout: float,
        unreachable_budget: float | None,
        trouble: Trouble | None = None,
    ) -> None:
        self._fabric = fabric
        self._trouble = trouble
        self._status = status
        self._timeout = attach_timeout
        # None: no budget of its own, an outage spends the attach timeout.
        self._budget = unreachable_budget
        # Whether a device is on a host that is none of the cluster's nodes (the reconciler's).
        self.theirs: Callable[[str], bool] = lambda _device_id: False

    async def connect(
        self,
        a: cl.FabricAllocation,
        v: Variant,
        deadline: float,
        asking: Callable[[], None] | None = None,
    ) -> float:
        """Attach; returns the deadline, moved on by the time the fabric was unusable.
        ``asking`` runs just before each attach request (none when an earlier
        request is adopted)."""
        timeout = self._timeout
        budget = timeout if self._budget is None else self._budget
        backoff = Backoff(RETRY_S, RETRY_CAP_S)
        down_since: float | None = None  # the fabric unreachable (or a resource broken) since
        told = ("", "")  # the last error told to ``trouble``: (case, message)
        while True:
            now = time.monotonic()
            if now > deadline:
                raise AttachFailed(f"{v.device_id}: no attach within {timeout:.0f}s")
            try:
                if await self._try_attach(a, v, deadline, asking):
                    return deadline
                down_since = None
                backoff.reset()
                await asyncio.sleep(RETRY_S)
            except (FabricUnavailable, FabricApiError) as exc:
                case = cases.case_of(exc)
                if not cases.retried(case):
                    raise
                down_since = now if down_since is None else down_since
                down = time.monotonic() - down_since
                if down >= budget:
                    raise AttachFailed(
                        f"{v.device_id}: fabric unusable for {down:.1f}s (budget {budget:g}s): "
                        f"{exc}"
                    ) from exc
                log.info(
                    "%s: %s for %.0fs of its %.0fs budget (%s): retry in %.1fs",
                    v.device_id, case, down, budget, exc, backoff.delay,
                )  # fmt: skip
                if (case, str(exc)) != told and self._trouble is not None:
                    told = (case, str(exc))
                    self._trouble(a, v, case, exc)
                await backoff.sleep()
                if self._budget is not None:
                    deadline += time.monotonic() - now  # an outage is not the attach's time

    async def _try_attach(
        self,
        a: cl.FabricAllocation,
        v: Variant,
        deadline: float,
        asking: Callable[[], None] | None = None,
    ) -> bool:
        """One try: True once attached; False to try again (busy, leaving another node).

        The fabric is asked only when no earlier request for this allocation
        is under way or done (:meth:`_adopt`), so each allocation costs one
        attach request, across retries and controller restarts alike.
        """
        fabric = self._fabric
        try:
            if await self._adopt(a, v, deadline):
                return True
            if asking is not None:
                asking()
            # The claim's UID makes the request's Idempotency-Key this allocation's own.
            result = await fabric.attach(v.device_id, v.node, v.adapter, key=a.claim_uid)
            crash_point("fabric-attach-answered")
            if result.task is not None:
                await self._record(a, v, result.task.uri)
                crash_point("fabric-attach-waiting")
                await self.finish(result.task.uri, deadline)
            return True
        except TimeoutError as exc:
            log.info("%s: %s: retrying", v.device_id, exc)
            return False
        except FabricConflict as exc:
            dev = await fabric.device(v.device_id)
            conn = dev.connection
            if not dev.available or (conn is None and exc.code.endswith("ResourceInUse")):
                raise AttachFailed(str(exc)) from exc  # another tenant holds it
            elsewhere = conn is not None and (conn.node, conn.adapter) != (v.node, v.adapter)
            if conn is not None and elsewhere and not a.name:  # a spare takes no one's device
                raise SpareTaken(f"{v.device_id} is attached to {conn.node}") from exc
            if conn is not None and elsewhere and self.theirs(v.device_id):
                host = conn.node or "a host no node maps to"
                raise AttachFailed(f"{v.device_id} is attached to {host}, not a node of this "
                                   "cluster: it is left there") from exc  # fmt: skip
            if conn is not None and conn.state == "Attached" and elsewhere:
                log.info("%s still attached to %s: detaching first", v.device_id, conn.node)
                gone = await fabric.detach(v.device_id)
                if gone is not None:
                    await fabric.wait(gone.uri, max(1.0, deadline - time.monotonic()))
                return False
            log.info("%s busy (%s): retrying", v.device_id, exc.code)
            return False

    async def finish(self, handle: str, deadline: float) -> None:
        """Follow an attach's operation handle to its end; AttachFailed if it failed."""
        task = await self._fabric.wait(handle, max(1.0, deadline - time.monotonic()))
        if task.failed:
            raise AttachFailed("; ".join(task.messages) or "attach task failed")

    async def _record(self, a: cl.FabricAllocation, v: Variant, handle: str) -> None:
        """Keep the operation handle on the claim, so a restart resumes it (a
        spare has no claim: a restart finds its connection instead)."""
        if not a.name:
            return
        what = f"{v.device_id} attaching to {v.node} via {v.adapter}"
        cond = cl.condition(READY_CONDITION, "Attaching", what, None, status="False")
        try:
            await self._status.write(a, cond, {cl.OPERATION_KEY: handle})
        except ApiError as exc:  # the fabric's own state still shows the attach
            log.info("claim %s/%s: recording operation %s: %s", a.namespace, a.name, handle, exc)

    async def _adopt(self, a: cl.FabricAllocation, v: Variant, deadline: float) -> bool:
        """True once an earlier request for this attach ended well; False: ask.

        The earlier request is this allocation's recorded operation, or a
        connection of the device to this node and adapter: attached, or on
        its way with or without a task to follow (followed, or watched until
        it is done: a connection that is not done is never adopted). A
        failed one is asked again (the fabric clears it).
        """
        fabric = self._fabric
        if a.operation:
            try:
                await self.finish(a.operation, deadline)
                log.info("%s: resumed operation %s", v.device_id, a.operation)
                return True
            except FabricNotFound:
                log.info("%s: operation %s is gone: reading the device", v.device_id, a.operation)
        while True:
            conn = (await fabric.inventory()).device(v.device_id).connection
            if conn is None or (conn.node, conn.adapter) != (v.node, v.adapter):
                return False
            if conn.state == "Attached":
                log.info("%s: already attached to %s via %s", v.device_id, v.node, v.adapter)
                return True
            if conn.state == "Failed":
                log.info("%s: its connection %s failed: asking again", v.device_id, conn.uri)
                return False
            if conn.state != "Attaching":
                return False  # leaving: ask again once it is gone
            if conn.task_uri:
                await self.finish(conn.task_uri, deadline)
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(f"{v.device_id} still attaching")
            await asyncio.sleep(RETRY_S)
