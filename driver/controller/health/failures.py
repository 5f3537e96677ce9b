"""Fabric devices their node found failed: tainted in the pool, detached, held out.

Why: a fabric GPU lives in the controller's fabric pool, which no node
plugin may write. The plugin names a failed GPU in its own
``patchbay.dev/fabric`` report (``failed``: class, taint effect, reason;
``driver.fabric_devices.node.gpu_failures``); this module keeps the
controller's record of each such device and says how the pool shows it:

- while attached: tainted with the key a node taints a local GPU with
  (``patchbay.dev/unhealthy``), the effect the node's policy gives the
  class (``NoExecute`` by default: kube-controller-manager evicts the pods
  using it) and the reason as value;
- once its node no longer reports it busy (no prepared claim, no process),
  the reconciler detaches it (also for an allocation still made), and it stays
  in the pool tainted ``NoSchedule`` with the same reason: marked failed,
  allocated to no claim that does not tolerate the taint, never a spare.

Where the record is kept: in the pool itself. The taint is in the
controller's own ResourceSlices, which a restarted controller or a new
leader reads back on its first pass (:meth:`FabricFailures.restore`): no
object of its own, no state that lives only in a process.

It ends, and the device is offered again, when

- the node it is attached to reports it no more while it is attached
  (its record there was removed by hand: a node never resets or checks a
  fabric GPU, and its record ends with the detach); or
- the fabric manager reports the detached device ``Critical`` (Redfish
  ``Status.Health``): the manager holds it out from then on (the pool offers
  no Critical device) and its ``OK`` brings it back; or
- an operator clears it: the annotation :data:`CLEAR_ANNOTATION` on any
  Node, a comma-separated list of ``<device>@<time>`` (the device's name in
  the pool or its fabric id; an RFC 3339 UTC time), clears a failure
  recorded at or before that time. Nodes are the operator's, only read
  here; the time keeps an old clear from clearing a later failure.

Concurrency: the reconciler's asyncio loop; pure apart from the wall clock
(the failure's time is a published ``timeAdded``, compared with an
operator's time).
"""

from __future__ import annotations

import calendar
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from driver.controller.events import (
    FABRIC_DEVICE_HELD_OUT,
    FABRIC_DEVICE_RETURNED,
    FABRIC_DEVICE_UNHEALTHY,
    ControllerEvents,
    node_ref,
)
from driver.devices.model import Device, DeviceTaint
from driver.fabric_devices.naming import NodeFabric, device_name
from driver.fabricclient.model import FabricInventory
from driver.health.monitor import TAINT_KEY
from driver.metrics import FABRIC_UNHEALTHY
from driver.slices.build import PoolSpec
from driver.slices.limits import MAX_VALUE_LEN

log = logging.getLogger(__name__)

CLEAR_ANNOTATION = "patchbay.dev/fabric-clear"
HELD_EFFECT = "NoSchedule"  # a detached failed device: nothing to evict, nothing to allocate
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Failure:
    """A failed fabric device as the controller keeps it."""

    device_id: str
    name: str  # its name in the per-domain pool (what an operator sees)
    node: str  # the node that reported it ("" when read back from the pool)
    failure_class: str  # "" when read back from the pool
    effect: str  # the taint's effect while attached
    reason: str
    since: str  # RFC 3339, the taint's timeAdded

    def taint(self, attached: bool) -> DeviceTaint:
        effect = self.effect if attached else HELD_EFFECT
        return DeviceTaint(TAINT_KEY, self.reason[: MAX_VALUE_LEN - 1], effect, self.since)


def clears(nodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Device (name or fabric id) -> the latest clear time any Node's
    :data:`CLEAR_ANNOTATION` names (malformed entries are logged, skipped)."""
    out: dict[str, float] = {}
    for node in nodes:
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(CLEAR_ANNOTATION)
        for item in filter(None, (p.strip() for p in str(raw or "").split(","))):
            device, _, when = item.rpartition("@")
            at = parse_time(when)
            if not device or at is None:
                log.warning("%s: %r is not <device>@<RFC 3339 time>: ignored",
                            CLEAR_ANNOTATION, item)  # fmt: skip
                continue
            out[device] = max(out.get(device, at), at)
    return out


def parse_time(text: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text.strip(), TIME_FORMAT)))
    except ValueError:
        return None


class FabricFailures:
    """Fabric device id -> its :class:`Failure`, and the pool marked with them."""

    def __init__(self, events: ControllerEvents) -> None:
        self.events = events
        self._failed: dict[str, Failure] = {}
        self._held: set[str] = set()  # detached and told so
        self._restored = False
        self._nodes: Mapping[str, Mapping[str, Any]] = {}
        self._attached: set[str] = set()  # failed devices attached, as of the last update
        FABRIC_UNHEALTHY.add_source(self, FabricFailures.samples)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._failed

    def ids(self) -> set[str]:
        return set(self._failed)

    def by_node(self) -> dict[str, set[str]]:
        """Node -> the devices that failed there (those read back from the
        pool name no node: a restart forgets where they failed)."""
        out: dict[str, set[str]] = {}
        for f in self._failed.values():
            if f.node:
                out.setdefault(f.node, set()).add(f.device_id)
        return out

    def held_out(self, device_id: str) -> str | None:
        """Why no attach may start for ``device_id`` (None: it may)."""
        f = self._failed.get(device_id)
        if f is None:
            return None
        return f"{device_id} ({f.name}) failed on a node ({f.reason}): held out of the pool"

    def failure(self, device_id: str) -> Failure | None:
        return self._failed.get(device_id)

    def restore(self, published: Mapping[str, Device]) -> None:
        """Once, on the first pass: the failures a previous incarnation
        published (its taints on the pool's devices)."""
        if self._restored:
            return
        self._restored = True
        for device in published.values():
            dev_id = device.attributes.get("fabricDevice")
            taint = next((t for t in device.taints if t.key == TAINT_KEY), None)
            if taint is None or not isinstance(dev_id, str) or dev_id in self._failed:
                continue
            self._failed[dev_id] = Failure(
                dev_id, device.name, "", "", taint.effect, taint.value, taint.time_added
            )
            log.warning("fabric device %s failed before this start (%s): held out",
                        dev_id, taint.value)  # fmt: skip

    def update(
        self, inv: FabricInventory, reports: Mapping[str, NodeFabric],
        nodes: Mapping[str, Mapping[str, Any]],
    ) -> None:  # fmt: skip
        """New failures from the reports of the nodes devices are attached to;
        the end of those the fabric manager took over or an operator cleared."""
        self._nodes = nodes
        self._learn(inv, reports)
        self._cured(inv, reports)
        self._end(inv, clears(nodes.values()))
        self._attached = {d.id for d in inv.devices if d.connection is not None} & set(self._failed)

    def samples(self) -> list[tuple[tuple[str, ...], float]]:
        """``patchbay_fabric_devices_unhealthy`` by state: attached, held."""
        attached = len(self._attached & set(self._failed))
        return [(("attached",), float(attached)), (("held",), float(len(self._failed) - attached))]

    def _learn(self, inv: FabricInventory, reports: Mapping[str, NodeFabric]) -> None:
        for d in inv.devices:
            conn = d.connection
            report = reports.get(conn.node) if conn is not None else None
            found = report.failed.get(d.identity) if report is not None else None
            if conn is None or found is None:
                continue
            known = self._failed.get(d.id)
            if known is not None:
                if not known.node:  # read back from the pool: its node says it again
                    self._failed[d.id] = dataclasses.replace(
                        known, node=conn.node, failure_class=found.failure_class
                    )
                continue
            since = found.since or time.strftime(TIME_FORMAT, time.gmtime())
            name = device_name(d.unique_identity, d.kind)
            f = Failure(d.id, name, conn.node, found.failure_class, found.effect, found.reason,
                        since)  # fmt: skip
            self._failed[d.id] = f
            self._held.discard(d.id)
            self._tell(f, FABRIC_DEVICE_UNHEALTHY, (
                f"fabric device {d.id} ({name}) failed on node {conn.node}: {f.reason} "
                f"({f.failure_class} class); tainted {f.effect} in the fabric pool, detached "
                "once no claim holds it prepared"))  # fmt: skip

    def _cured(self, inv: FabricInventory, reports: Mapping[str, NodeFabric]) -> None:
        """A failure ends while its device is attached when the node it is
        attached to reports it no more (its record there was removed by hand)."""
        for d in inv.devices:
            f, conn = self._failed.get(d.id), d.connection
            report = reports.get(conn.node) if conn is not None else None
            if f is None or report is None or d.identity in report.failed:
                continue
            if not report.sees(d.kind, d.identity, conn.adapter if conn else ""):
                continue  # not (yet) seen there: no word from its node
            del self._failed[d.id]
            note = f"fabric device {d.id} ({f.name}): its node reports it healthy again"
            self._tell(f, FABRIC_DEVICE_RETURNED, note)

    def _end(self, inv: FabricInventory, cleared: Mapping[str, float]) -> None:
        for d in inv.devices:
            f = self._failed.get(d.id)
            if f is None or d.connection is not None:
                continue  # still attached: its node's word holds
            at = max(cleared.get(f.name, 0.0), cleared.get(d.id, 0.0))
            when = parse_time(f.since)
            if d.health == "Critical":
                why = "the fabric manager reports it Critical: held out until it reports it OK"
            elif at and when is not None and when <= at:
                why = f"an operator cleared it ({CLEAR_ANNOTATION}): offered again"
            else:
                if d.id not in self._held:
                    self._held.add(d.id)
                    self._tell(f, FABRIC_DEVICE_HELD_OUT, (
                        f"fabric device {d.id} ({f.name}) detached and held out of the pool: "
                        f"{f.reason}; taint {TAINT_KEY}={f.reason}:{HELD_EFFECT}"))  # fmt: skip
                continue
            del self._failed[d.id]
            self._held.discard(d.id)
            self._tell(f, FABRIC_DEVICE_RETURNED, f"fabric device {d.id} ({f.name}): {why}")

    def _tell(self, f: Failure, reason: str, note: str) -> None:
        """Log ``note``; an Event on the Node that reported the failure (none
        for one read back from the pool: its node is not known)."""
        log.log(logging.INFO if reason == FABRIC_DEVICE_RETURNED else logging.WARNING, "%s", note)
        if f.node:
            self.events.fabric_health(node_ref(self._nodes, f.node), reason, note)

    def mark(self, specs: Iterable[PoolSpec], inv: FabricInventory) -> list[PoolSpec]:
        """``specs`` with each failed device tainted (attached: the node's
        effect; detached: ``NoSchedule``) and every other fabric device
        without that key (a device carried from before keeps no old taint)."""
        attached = {d.id for d in inv.devices if d.connection is not None}
        out = []
        for spec in specs:
            devices = tuple(self._marked(d, attached) for d in spec.devices)
            out.append(dataclasses.replace(spec, devices=devices))
        return out

    def _marked(self, device: Device, attached: set[str]) -> Device:
        dev_id = device.attributes.get("fabricDevice")
        if not isinstance(dev_id, str):
            return device
        taints = tuple(t for t in device.taints if t.key != TAINT_KEY)
        f = self._failed.get(dev_id)
        if f is not None:
            taints = (*taints, f.taint(dev_id in attached))
        return device if taints == device.taints else dataclasses.replace(device, taints=taints)
