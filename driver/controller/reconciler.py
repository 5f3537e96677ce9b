"""The controller's core: fabric pool, attachments and claim conditions.

Why: the scheduler allocates a fabric variant and waits in PreBind; this
module attaches the device to that node through that adapter, waits until
the node plugin reports the device, and sets ``FabricDeviceReady=True`` (or
``FabricDeviceFailed=True``, keeping the device out of the pool for a hold
time when the attach was refused or failed: ``driver.controller.attach.cases``).
A device a partial read holds back stays as last seen: nothing is
unpublished or detached for it, and a ready claim holding it is told
(an Event). A fabric connection that no allocation needs any more (claim
deallocated or deleted, pod deleted while PreBind waited, a previous
incarnation's leftovers) is detached once its node no longer reports it held
by a prepared claim (a node whose Node object is gone holds nothing; a
device on a host that is none of our nodes is left alone: ``controller.hosts``).
A fabric GPU its node reports failed is tainted in the pool, detached once
no prepared claim holds it (even while still allocated) and held out
(``driver.controller.health.failures``).
Everything is level-triggered: each pass compares claims (watched), Nodes
(watched) and the fabric inventory (re-read on each fabric event, after
every operation and every ``fabric_refresh`` seconds as a safety net), so a
restart rebuilds its view and finishes or rolls back what was in flight.

Concurrency: one asyncio loop. :meth:`Reconciler.run` runs the two watches,
the slice publisher, the fabric refresher and the reconcile loop in one
TaskGroup; each attach or detach is its own task, at most one per fabric
device (``driver.controller.attach.workers``), so two operations never race on one
device. The workers get their collaborators from here (claim-status
writer, node reports, failed-device holds) and never see the reconciler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from driver.backoff import Backoff
from driver.controller import claims as cl
from driver.controller.attach import memdevs
from driver.controller.attach.holds import FailedHolds
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.status import ClaimStatusWriter
from driver.controller.attach.workers import Workers
from driver.controller.broken import BrokenResources, LeaseNamed
from driver.controller.events import CONTROLLER, ControllerEvents, gone_adapters, node_ref
from driver.controller.health.failures import FabricFailures
from driver.controller.hosts import OtherHosts
from driver.controller.pool.domains import LabelFinding
from driver.controller.pool.layout import mark_spares
from driver.controller.pool.model import pool_model
from driver.controller.pool.room import AdapterRoom
from driver.controller.pool.states import carry_held_back, device_states, published_devices
from driver.controller.pool.variant import Variant
from driver.controller.requeue import Requeue
from driver.controller.spares.keeper import SpareKeeper
from driver.controller.spares.policy import SpareRules
from driver.devices.model import Device
from driver.errors import FabricApiError, FabricUnavailable
from driver.fabric_devices.naming import NodeFabric, in_fabric_pool, is_adapter_pool
from driver.fabricclient.model import FabricInventory
from driver.fabricclient.protocol import FabricApi
from driver.kube.api import RESOURCE_V1
from driver.kube.cache import ObjectCache
from driver.kube.client import KubeClient
from driver.kube.events import EventRecorder
from driver.metrics import FABRIC_DEVICES, FABRIC_POOL_DEVICES
from driver.slices.pool_set import PoolSetPublisher

log = logging.getLogger(__name__)

PUBLISH_WAIT_S = 10.0


class Settings(LeaseNamed, Protocol):
    """What the reconciler reads of ``process.settings.ControllerSettings``
    (each one setting there: flag, env var and Helm value)."""

    @property
    def fabric_pool(self) -> str: ...
    @property
    def fabric_pool_shape(self) -> str: ...
    @property
    def fabric_refresh(self) -> float: ...
    @property
    def attach_timeout(self) -> float: ...
    @property
    def fabric_unreachable_budget(self) -> float: ...
    @property
    def failed_device_hold(self) -> float: ...
    @property
    def identity(self) -> str: ...
    def spare_rules(self) -> SpareRules: ...


class Reconciler:
    def __init__(self, api: KubeClient, fabric: FabricApi, settings: Settings) -> None:
        self.api = api
        self.fabric = fabric
        self.settings = settings
        self.pool = settings.fabric_pool
        # Variants per node, each device once per reach domain, or a count manager's slots.
        self.model = pool_model(fabric.picks_devices, settings.fabric_pool_shape)
        self._dirty = asyncio.Event()
        self._refresh = asyncio.Event()
        self.nodes = ObjectCache(api, "/api/v1/nodes", self.mark)
        # The fabric pool and its per-domain pools (a shape's others are withdrawn).
        family = functools.partial(in_fabric_pool, fabric_pool=self.pool)
        query = {"fieldSelector": "spec.driver=patchbay.dev"}
        self.publisher = PoolSetPublisher(api, query, family, "patchbay-controller")
        self.publisher.on_listed = self.mark  # the first pass waits for the stored slices
        self.requeue = Requeue(self.pool, self.publisher.renew)  # a PreBind nobody waits for
        self.claims = ObjectCache(api, f"{RESOURCE_V1}/resourceclaims", self.mark,
                                  on_event=self.requeue.seen)  # fmt: skip
        self.inventory: FabricInventory | None = None
        self.variants: dict[str, Variant] = {}  # every variant ever published, by name
        self.published: dict[str, Device] = {}  # the last published device of each name
        self.holds = FailedHolds(settings.failed_device_hold, self.mark)
        self.reports = NodeReports()
        self.recorder = EventRecorder(api, CONTROLLER, settings.identity)
        self.events = ControllerEvents(self.recorder)
        self.failures = FabricFailures(self.events)  # failed fabric GPUs: tainted, held out
        self.broken = BrokenResources(api, self.events, settings)  # told even if no claim meets it
        self.hosts, self.others = OtherHosts(), frozenset[str]()  # on no node of ours: left alone
        self.holds.failed = self.failures.held_out  # no attach starts for one
        self._adapters: tuple[dict[str, NodeFabric], set[tuple[str, str]]] | None = None
        self._findings: set[LabelFinding] = set()
        self._node_uuids: dict[str, str] = {}
        # (claim UID, device) -> why a read holds that attached device back, as told.
        self._doubts: dict[tuple[str, str], str] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.workers = Workers(
            fabric,
            ClaimStatusWriter(api, self.pool),
            self.reports,
            self.holds,
            settings.attach_timeout,
            self._operation_done,
            self.events,
            settings.fabric_unreachable_budget,
            self._pool_published,
        )
        self.workers.connector.theirs = lambda device_id: device_id in self.others  # not taken
        FABRIC_DEVICES.add_source(self, lambda r: device_states(r.inventory, r.holds.held()))
        self.spares = SpareKeeper(settings.spare_rules(), self.workers, self.events, self.mark)
        self.clock = time.monotonic  # the spare policy's clock (tests inject their own)

    def mark(self) -> None:
        self._dirty.set()

    async def _pool_published(self) -> None:
        """Wait until the pool as of now (a new hold included) is stored.

        A pass builds it at once (passes are level-triggered and await
        nothing); the wait ends when the publisher has written it, or after
        ``PUBLISH_WAIT_S`` with the apiserver unreachable, when what follows
        (a claim status write) cannot land either.
        """
        self.reconcile()
        try:
            async with asyncio.timeout(PUBLISH_WAIT_S):  # not wait_for: docs/design.md
                await self.publisher.in_sync.wait()
        except TimeoutError:
            log.warning("the fabric pool was not stored within %.0fs", PUBLISH_WAIT_S)

    def _operation_done(self) -> None:
        self.refresh_fabric()
        self.mark()

    async def run(self) -> None:
        try:
            await self._run()
        finally:  # nothing attaches once the reconciler is gone (the Lease goes next)
            await self.workers.stop()

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.claims.run(), name="claims-watch")
            group.create_task(self.nodes.run(), name="nodes-watch")
            group.create_task(self.publisher.run(), name="fabric-pool")
            group.create_task(self._fabric_loop(), name="fabric-refresh")
            group.create_task(self._event_loop(), name="fabric-events")
            group.create_task(self._loop(), name="reconcile")
            group.create_task(self.recorder.run(), name="events")

    async def _fabric_loop(self) -> None:
        while True:
            try:
                requested = time.monotonic()
                read = await self.fabric.inventory()
                self.inventory = carry_held_back(read, self.inventory)
                self.workers.inventory_read(requested)
                self.mark()
                await self.broken.seen(read)
            except (FabricApiError, FabricUnavailable) as exc:
                log.warning("fabric inventory read failed: %s", exc)
            with contextlib.suppress(TimeoutError):  # not wait_for: docs/design.md
                async with asyncio.timeout(self.settings.fabric_refresh):
                    await self._refresh.wait()
            self._refresh.clear()

    async def _event_loop(self) -> None:
        """Re-read the fabric on each of its events (polling stays as a safety net)."""
        backoff = Backoff(0.5)
        while True:
            try:
                async for origins in self.fabric.events():
                    log.debug("fabric event: %s", origins or "subscribed")
                    self.refresh_fabric()
                    backoff.reset()
            except FabricUnavailable as exc:
                log.info("fabric event stream lost (%s): reconnecting in %.1fs", exc, backoff.delay)
            except FabricApiError as exc:
                log.warning("fabric has no event stream (%s): polling only", exc)
                return
            await backoff.sleep()

    def refresh_fabric(self) -> None:
        self._refresh.set()

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                self.reconcile()
            except Exception:
                log.exception("reconcile pass failed")
                await asyncio.sleep(1.0)
                self.mark()

    def reconcile(self) -> None:
        """One level-triggered pass (no awaits: work goes to worker tasks)."""
        waiting = [
            what
            for what, ready in (
                ("claims", self.claims.synced.is_set()),
                ("nodes", self.nodes.synced.is_set()),
                ("slices", self.publisher.synced.is_set()),
                ("fabric inventory", self.inventory is not None),
            )
            if not ready
        ]
        if waiting:
            log.debug("reconcile waits for: %s", ", ".join(waiting))
            return
        self._learn_node_uuids()
        self.fabric.set_nodes(self.nodes.objects.values())  # a count fabric's machine ids
        inv = self.inventory
        assert inv is not None
        reports = self.reports.refresh(self.nodes.objects)  # wakes attaches waiting on a node
        self._watch_adapters(reports, inv)
        if not self.published:  # first pass: what a previous incarnation published
            self.published = published_devices(self.publisher.stored().values())
            self.failures.restore(self.published)  # kept in the pool's taints
        self.failures.update(inv, reports, self.nodes.objects)
        self.holds.expire()
        self.others = self.hosts.devices(inv, self.nodes.objects)  # never published or detached
        allocs = cl.all_allocations(list(self.claims.objects.values()), self.pool)
        self.requeue.note(allocs, self.claims.objects.values())
        self.workers.memdevs.learn(memdevs.claimed(allocs, inv))  # a restart noted nothing
        self._tell_doubts(inv, allocs)
        pinned = {a.device: a.pool for a in allocs}
        carried = {n: self.published[n] for n in pinned if n in self.published}
        served = {a.device: self._device_of(a) for a in allocs if a.device in self.variants}
        held, w, nodes = self.holds.held() | self.others, self.workers, self.nodes.objects
        model = self.model
        specs, variants = model.build(
            self.pool, inv, reports, held, pinned, carried, served, nodes.values()
        )
        self.variants.update(variants)
        self._report_labels()
        stored = self.publisher.stored().values()
        kept = {s.device_id for s in self.spares.last.keep}
        model.take_up(inv, reports, allocs, self.variants, w, stored, kept)
        now, models = self.clock(), {d.id: d.model for d in inv.devices}
        models |= model.models(self.variants.values())
        # Demand is per node: a device published once is on its allocation's node.
        where = {a.device: model.place(self.variants[a.device], a, inv, reports)
                 for a in allocs if a.device in self.variants}  # fmt: skip
        self.spares.note_allocations(allocs, self.variants | where, models, nodes, now)
        in_use = {self._device_of(a) for a in allocs if a.device in self.variants}
        reserved, reclaim = model.shortfall(inv, allocs, self.variants, w.served, in_use, w.busy)
        out = self.holds.held() | self.failures.ids() | self.others  # never a spare
        spares = self.spares.reconcile(
            inv, reports, nodes, in_use, out, now, reserved, reclaim, self.failures.by_node()
        )
        specs, shown = model.with_spares(specs, inv, reports, spares.variants)
        if model.holds_back():
            self._when_stored()  # a spare joins its node's pool once it left the others
        self.variants.update(shown)
        self.published.update({d.name: d for spec in specs for d in spec.devices})
        marked = self.failures.mark(specs, inv)
        self.publisher.set_pools([mark_spares(spec, spares.variants) for spec in marked])
        FABRIC_POOL_DEVICES.set(
            sum(len(s.devices) for s in specs if not is_adapter_pool(s.pool_name, self.pool))
        )
        # An attach that ended here is remembered until the cache shows its outcome.
        self.workers.forget({(a.claim_uid, a.device) for a in allocs if not (a.ready or a.failed)})
        needed: set[str] = set()
        attaches: list[tuple[cl.FabricAllocation, Variant]] = []
        for a in allocs:
            v = self.variants.get(a.device)
            if v is None:
                log.warning("claim %s/%s: unknown fabric variant %s", a.namespace, a.name, a.device)
                continue
            if a.failed:
                continue
            needed.add(self._device_of(a))
            v = model.place(v, a, inv, reports)  # a device published once: on a's node
            if not a.ready and not self._hand_over(inv, reports, a, v):
                attaches.append((a, v))
        # Adapter room (pool.room): the attaches under way hold theirs, then the new ones.
        room, busy = AdapterRoom(inv), self.workers.busy
        for a, v in sorted(attaches, key=lambda p: not busy(p[1].device_id)):
            self.workers.attach(a, room.admit(v))
        # Only an allocation that is gone cancels its attach: one that just
        # turned ready is the attach's own status write, and cancelling then
        # would drop the rest of its work (the Attached Event, its figures).
        self.workers.cancel_unneeded({(a.claim_uid, a.device) for a in allocs})
        # Seen as last read, or on another host (driver.controller.hosts): never detached.
        in_doubt = {ident for ident, _ in inv.held_back} | self.others
        memdevs_kept = frozenset((a.node, a.memdev) for a in allocs if a.memdev and not a.failed)
        for device in inv.devices:
            conn = device.connection
            # A failed device is detached once no claim holds it prepared (a spare too).
            wanted = device.id in needed or device.id in spares.keep
            if conn is None or (wanted and device.id not in self.failures):
                continue
            if device.id in in_doubt:
                log.debug("%s is held back by the last read or another host's: no detach",
                          device.id)  # fmt: skip
                continue
            if self.workers.scaling_up(conn.node):  # a pass follows its answer
                log.debug("%s may be what a scale-up for %s brings: no detach before its "
                          "answer", device.id, conn.node)  # fmt: skip
                continue
            if device.id in spares.withdrawing and not self.publisher.in_sync.is_set():
                self._when_stored()  # published as a spare: detached once it is not
                continue
            report = reports.get(conn.node)
            if report is not None and memdevs.still_prepared(
                report, device, conn.node, memdevs_kept
            ):
                # Released, but the kubelet has not unprepared it yet (e.g. a
                # force-deleted pod): its node's next report brings us back.
                log.debug("%s still prepared on %s: detach waits", device.id, conn.node)
                continue
            self.workers.detach(device.id, node_ref(self.nodes.objects, conn.node))

    def _tell_doubts(self, inv: FabricInventory, allocs: list[cl.FabricAllocation]) -> None:
        """A Warning on each ready claim whose device the last read held back
        (kept as last seen: nothing is detached), once per reason (an attach
        under way tells its own: ``attach.cases``)."""
        held, told = dict(inv.held_back), {}
        for a in allocs:
            device = self._device_of(a) if a.ready and a.device in self.variants else ""
            why = held.get(device) if device else None
            if why is not None:
                told[(a.claim_uid, device)] = why
                if self._doubts.get((a.claim_uid, device)) != why:
                    log.warning("claim %s/%s: its fabric device %s is in doubt: %s",
                                a.namespace, a.name, device, why)  # fmt: skip
                    self.events.device_in_doubt(a, device, why)
        self._doubts = told

    def _hand_over(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric], a: cl.FabricAllocation,
        v: Variant,
    ) -> bool:  # fmt: skip
        """True while ``v``'s device is detached first: attached elsewhere (a
        warm spare there, or a claim's device its node no longer holds
        prepared), it leaves that node before the attach for ``a`` starts."""
        device = next((d for d in inv.devices if d.id == v.device_id), None)
        conn = device.connection if device is not None else None
        if conn is None or (conn.node, conn.adapter) == (v.node, v.adapter):
            return False
        if v.device_id in self.others:  # another host's: its attach meets the manager's refusal
            return False
        report = reports.get(conn.node)
        if conn.state != "Attached" or (report is not None and v.identity in report.busy):
            return False  # the attach waits for it as before
        if not self.workers.busy(v.device_id):
            log.info("%s is attached to %s: detaching it for claim %s/%s on %s",
                     v.device_id, conn.node, a.namespace, a.name, v.node)  # fmt: skip
            self.workers.detach(v.device_id, node_ref(self.nodes.objects, conn.node))
        return True

    def _device_of(self, a: cl.FabricAllocation) -> str:
        """The fabric device allocation ``a`` holds: its variant's, or for a
        count-based manager's slot the one that arrived ("" before)."""
        return self.model.device_of(self.variants[a.device], self.workers.served(a))

    def _when_stored(self) -> None:
        """A pass once the pool as now declared is stored."""

        async def wait() -> None:
            await self.publisher.in_sync.wait()
            self.mark()

        task = asyncio.get_running_loop().create_task(wait(), name="spare-withdrawn")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _learn_node_uuids(self) -> None:
        """Tell the fabric client each Node's ``systemUUID`` (those only one Node
        has: nodes on one machine share it) and re-read the fabric on a change."""
        uuids = node_uuids(self.nodes.objects.values())
        if uuids != self._node_uuids:
            self._node_uuids = uuids
            self.fabric.set_node_uuids(uuids)
            self.refresh_fabric()

    def _report_labels(self) -> None:
        """A Warning Event on each Node whose reach label disagrees with its
        adapters, once per new disagreement (``driver.controller.pool.domains``)."""
        now = set(self.model.findings())
        for f in sorted(now - self._findings, key=lambda f: (f.node, f.domain)):
            log.warning("node %s: %s", f.node, f.note())
            self.events.reach_label(node_ref(self.nodes.objects, f.node), f.labelled, f.note())
        self._findings = now

    def _watch_adapters(self, reports: dict[str, NodeFabric], inv: FabricInventory) -> None:
        """An Event on each Node whose report or fabric entry lost an adapter."""
        listed = {(a.node, a.adapter) for a in inv.adapters}
        if self._adapters is not None:
            nodes = self.nodes.objects
            for node, adapter, why in gone_adapters(*self._adapters, reports, listed, nodes):
                log.warning("node %s: fabric adapter %s gone: %s", node, adapter, why)
                self.events.adapter_gone(node_ref(nodes, node), adapter, why)
        self._adapters = (reports, listed)


def node_uuids(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """systemUUID (lower case) -> Node name, for the UUIDs exactly one Node reports."""
    seen: dict[str, list[str]] = {}
    for node in nodes:
        uuid = str(((node.get("status") or {}).get("nodeInfo") or {}).get("systemUUID") or "")
        name = str((node.get("metadata") or {}).get("name") or "")
        if uuid and name:
            seen.setdefault(uuid.lower(), []).append(name)
    return {uuid: names[0] for uuid, names in seen.items() if len(names) == 1}
