"""Carry out the warm-spare policy on each reconcile pass.

Why: ``driver.controller.spares.policy`` decides over plain values; this module
gathers them from the fabric inventory, the node reports and the claims,
keeps what the policy needs to remember (when each spare became one, when
each node last saw an allocation of a model, which allocations were
counted), starts spare attaches on the workers and says which variants
the pool publishes as spares (no binding conditions) and which spares'
devices must not be detached yet.

Spare-ness is not recorded anywhere: a spare is a connection that no
allocation needs and the policy keeps. A restarted controller finds its
predecessor's spares attached, and keeps those the policy wants (their
idle clocks start at the restart; the count it finds per node and model
stays wanted, not more, for a demand window; allocations it finds re-open
their nodes' windows) instead of detaching and attaching again.

A spare that is CXL memory is published under its memdev's node name (the
LDs of one MLD share the serial: docs/fabric.md, "Logical devices"): the
one its attach noted (``attach.memdevs``), or after a restart the one alone
with its serial there; one that cannot be told is released, naming them.

On a count-based manager's fabric the attach brings whatever device the
manager chose: that one is the spare (``driver.controller.pool.slot_spares``
publishes it and says which spares its waiting slots need back).

Concurrency: the reconciler's asyncio loop only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from driver.controller import claims as cl
from driver.controller.attach.workers import Workers
from driver.controller.events import ControllerEvents, node_ref
from driver.controller.pool.variant import Variant, as_memdev, offered, reachable
from driver.controller.spares.policy import Free, Key, Retire, Spare, SparePlan, SpareRules, plan
from driver.controller.spares.replace import lost_gpus, replacements
from driver.cxl import KIND as CXL_MEMORY
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.metrics import FABRIC_REPLACEMENTS, FABRIC_SPARE_ALLOCATIONS, FABRIC_SPARES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpareView:
    """What a pass publishes and must leave attached."""

    # Published as spares (no binding conditions), by name: as their nodes
    # name them (CXL memory: by its memdev, ``pool.variant.as_memdev``).
    variants: Mapping[str, Variant] = dataclasses.field(default_factory=dict)
    keep: frozenset[str] = frozenset()  # device ids: spares, not to be detached
    withdrawing: frozenset[str] = frozenset()  # device ids: detach once the pool is stored


class SpareKeeper:
    def __init__(
        self, rules: SpareRules, workers: Workers, events: ControllerEvents,
        mark: Callable[[], None],
    ) -> None:  # fmt: skip
        self.rules = rules
        self._workers = workers
        self._events = events
        self._mark = mark
        self._since: dict[str, float] = {}  # device id -> when it became a spare
        self._demand: dict[Key, float] = {}  # (node, kind, model) -> last allocation there
        self._counted: set[tuple[str, str]] = set()  # allocations counted as hit or miss
        self._attaching: dict[str, Spare] = {}  # spare attaches under way
        self._published: frozenset[str] = frozenset()  # device ids shown as spares, last pass
        self._wake: asyncio.TimerHandle | None = None
        self._first = True  # the first pass adopts a predecessor's spares
        self._carried: dict[Key, int] = {}  # what the first pass found, per key
        self._carried_until = 0.0
        self._released: set[str] = set()  # devices of retired spares not detached yet
        self.last = SparePlan()
        FABRIC_SPARES.add_source(self, SpareKeeper.samples)

    def note_allocations(
        self, allocs: Iterable[cl.FabricAllocation], variants: Mapping[str, Variant],
        models: Mapping[str, str], nodes: Mapping[str, object], now: float,
    ) -> None:  # fmt: skip
        """Count each allocation once, as a hit (a spare: no binding
        conditions) or a miss, and open its node's demand window."""
        current = {(a.claim_uid, a.device) for a in allocs}
        self._counted &= current
        for a in allocs:
            v = variants.get(a.device)
            if (a.claim_uid, a.device) in self._counted or v is None:
                continue
            self._counted.add((a.claim_uid, a.device))
            model = models.get(v.device_id, "")
            if self.rules.on_demand(v.kind, model):
                self._demand[(v.node, v.kind, model)] = now
            if not a.waits:
                FABRIC_SPARE_ALLOCATIONS.labels(result="hit").inc()
                self._events.spare_taken(a, v)
            elif self.rules.enabled:
                FABRIC_SPARE_ALLOCATIONS.labels(result="miss").inc()

    def spares(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric], needed: set[str], now: float
    ) -> list[Spare]:
        """The devices attached or attaching that no allocation needs and no
        prepared claim holds (a released one its node has not unprepared).
        A failed connection is no spare: the reconciler detaches it."""
        out = []
        for d in inv.devices:
            conn = d.connection
            if d.id in needed or conn is None or conn.state in ("Detaching", "Failed"):
                continue
            if self._workers.arriving(d.id):  # listed as its spare attach, under way
                continue
            report = reports.get(conn.node)
            memdev = self._memdev(d, conn.adapter, report)
            if report is not None and (memdev or d.identity) in report.busy:
                continue
            ready = conn.state == "Attached" and report is not None and memdev is not None
            ready = ready and report is not None and report.sees(d.kind, d.identity, conn.adapter)
            healthy = offered(d) and report is not None and conn.adapter in report.adapters
            why = self._undecided(d, conn.adapter, report) if memdev is None else ""
            since = self._since.setdefault(d.id, now)
            out.append(Spare(d.id, d.kind, d.model, conn.node, conn.adapter, ready, since,
                             healthy and not why, why))  # fmt: skip
        listed = {s.device_id for s in out}
        out += [s for dev, s in self._attaching.items() if dev not in listed and dev not in needed]
        return out

    def _memdev(self, d: FabricDevice, adapter: str, report: NodeFabric | None) -> str | None:
        """The memdev CXL memory ``d``, attached behind ``adapter``, is on its
        node: the one its attach noted, or found alone with its serial there
        (``MemdevArrivals.adopted``); "" for another kind or a report by
        serial (an older plugin); None while it cannot be told (its attach
        runs, or several of its serial are there that no attach noted)."""
        if d.kind != CXL_MEMORY or report is None or not report.memdevs(d.identity, adapter):
            return ""
        if self._workers.busy(d.id):
            return None
        return self._workers.memdevs.adopted(report, d.id, d.identity, adapter) or None

    def _undecided(self, d: FabricDevice, adapter: str, report: NodeFabric | None) -> str:
        """Why spare ``d`` cannot be published, its memdev not told ("" if it can
        wait: its attach runs): released, and attached again as a spare."""
        if report is None or self._workers.busy(d.id):
            return ""
        keys = report.memdevs(d.identity, adapter)
        return (f"its memdev cannot be told: {len(keys)} CXL memdevs of serial {d.identity} "
                f"behind {adapter} ({', '.join(keys)}) and none noted as its")  # fmt: skip

    def free(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric], busy: set[str]
    ) -> list[Free]:
        out = []
        for d in inv.devices:
            if d.connection is not None or not offered(d) or d.id in busy:
                continue
            places = tuple((v.node, v.adapter) for v in reachable(d, reports))
            if places and d.id not in self._attaching:
                out.append(Free(d.id, d.kind, d.model, places))
        return out

    def reconcile(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        nodes: Mapping[str, Mapping[str, object]], needed: set[str], held: set[str],
        now: float, reserved: Collection[str] = (), reclaim: Collection[str] = (),
        failed: Mapping[str, Collection[str]] | None = None,
    ) -> SpareView:  # fmt: skip
        """One pass: plan, start the attaches, and say what the pool shows.

        ``reserved``: free devices not to attach as spares; ``reclaim``: spares
        to release for a claim (a count fabric's, ``pool.slot_spares.shortfall``);
        ``failed``: node -> the fabric devices that failed there (replaced
        with ``replace_failed``, as are the local GPUs a node lost)."""
        for dev in needed & set(self._attaching):
            self._workers.cancel_spare(dev)  # a claim needs it now
        if not self.rules.enabled and not self._since and not self._attaching:
            return SpareView()
        # An attached spare stays listed as attaching until an inventory read
        # after its attach shows it (the workers' settling): a pass on the
        # stale one would count one spare short and attach another.
        w = self._workers
        for dev in [d for d in self._attaching if not (w.busy(d) or w.settling(d))]:
            del self._attaching[dev]
        busy = needed | held | {d.id for d in inv.devices if w.busy(d.id) or w.settling(d.id)}
        busy |= set(reserved)
        spares = self.spares(inv, reports, needed, now)
        if self._first:  # a restart: what it finds stays wanted (not more) for a window
            self._first = False
            for sp in spares:
                self._carried[sp.key] = self._carried.get(sp.key, 0) + 1
            self._carried_until = now + self.rules.window
        if now >= self._carried_until:
            self._carried.clear()
        free = self.free(inv, reports, busy)
        size = sum(1 for d in inv.devices if d.identity)
        adapters = [n for n, r in reports.items() if r.adapters]
        extra: dict[Key, int] = {}
        if self.rules.replace_failed:
            lost = lost_gpus(nodes, inv, failed or {})
            ids = {i for devs in (failed or {}).values() for i in devs}
            extra = replacements(lost, inv, needed, ids, spares, free)
        p = plan(self.rules, spares, free, size, adapters, self._demand, now, self._carried,
                 extra)  # fmt: skip
        if reclaim:
            back = tuple(Retire(s, "needed by a claim") for s in p.keep if s.device_id in reclaim)
            keep = tuple(s for s in p.keep if s.device_id not in reclaim)
            p = dataclasses.replace(p, keep=keep, retire=p.retire + back)
        self.last = p
        for key in p.closed:
            self._demand.pop(key, None)
            self._carried.pop(key, None)
        released = {r.spare.device_id for r in p.retire}
        for r in p.retire:
            if r.spare.device_id in self._released:
                continue  # said so in an earlier pass: its detach is under way
            if r.spare.device_id not in self._attaching:
                log.info("spare %s on %s released: %s", r.spare.device_id, r.spare.node, r.why)
                self._events.spare_released(node_ref(nodes, r.spare.node), r.spare.device_id, r.why)
            else:
                self._workers.cancel_spare(r.spare.device_id)
        self._released = released
        by_id = {d.id: d for d in inv.devices}
        for dev, node, adapter in p.attach:
            self._start(by_id[dev], node, adapter, reports, nodes, now)
            if (node, by_id[dev].kind, by_id[dev].model) in extra:
                FABRIC_REPLACEMENTS.inc()
        self._since = {s.device_id: s.since for s in p.keep}
        self._since |= {dev: s.since for dev, s in self._attaching.items()}
        shown = {s.device_id: s for s in p.keep if s.ready and s.device_id in by_id}
        variants = {}
        for i, s in shown.items():
            v = next((v for v in reachable(by_id[i], reports) if (v.node, v.adapter) ==
                      (s.node, s.adapter)), None)  # fmt: skip
            if v is not None:
                v = as_memdev(v, self._memdev(by_id[i], s.adapter, reports.get(s.node)) or "")
                variants[v.name] = v
        # A spare published without binding conditions is detached only once
        # the pool without that is stored: no scheduler can take it meanwhile.
        withdrawn = frozenset(r.spare.device_id for r in p.retire) & self._published
        self._published = frozenset(shown)
        ends = [t for t in (p.wake_at, self._carried_until if self._carried else None) if t]
        self._schedule(min(ends, default=None), now)
        return SpareView(variants, frozenset(s.device_id for s in p.keep), withdrawn)

    def _start(
        self, d: FabricDevice, node: str, adapter: str, reports: Mapping[str, NodeFabric],
        nodes: Mapping[str, Mapping[str, object]], now: float,
    ) -> None:  # fmt: skip
        v = next(v for v in reachable(d, reports) if (v.node, v.adapter) == (node, adapter))
        spare = Spare(d.id, d.kind, d.model, node, adapter, False, now)

        def ended(attached: str) -> None:
            if attached != d.id:  # an attached one: listed until the inventory shows it
                self._attaching.pop(d.id, None)
                self._since.pop(d.id, None)
            if attached and attached != d.id:  # a count-based manager chose that one
                self._attaching[attached] = dataclasses.replace(spare, device_id=attached)
                self._since[attached] = now
            self._mark()

        if self._workers.attach_spare(v, node_ref(nodes, node), ended):
            log.info("attaching %s to %s via %s as a warm spare", d.id, node, adapter)
            self._attaching[d.id] = spare
            self._since[d.id] = now

    def _schedule(self, at: float | None, now: float) -> None:
        """A pass when the next idle timeout or demand window ends."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if at is not None:
            self._wake = asyncio.get_running_loop().call_later(max(0.0, at - now) + 0.1, self._mark)

    def samples(self) -> list[tuple[tuple[str, ...], float]]:
        """``patchbay_fabric_spares`` by state: attaching, ready (a pod can take
        it at once), attached (its node does not report it yet)."""
        counts = {"attaching": 0, "ready": 0, "attached": 0}
        for s in self.last.keep:
            state = "attaching" if s.device_id in self._attaching else "ready"
            counts[state if s.ready or state == "attaching" else "attached"] += 1
        return [((state,), float(n)) for state, n in counts.items()]
