"""Which attached device serves a count slot that holds none: taking up what is there.

Why a module: a count-based manager answers a slot's attach with the device
it chose (``driver.controller.attach.slot_attach``), and the worker records
that device on the claim at once. For the moment between the answer and
that write (or an answer the controller never read, lost to a restart),
:func:`take_up` gives a waiting slot allocation a device of its model
already attached to its node that nothing needs, instead of it being
detached as a leftover and asked for again. Never while a scale-up for
that node is under way (``Expectations.asking``): what is attached there
may be its answer, another allocation's. It reads the workers through
:class:`Serving` only.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from driver.controller import claims as cl
from driver.controller.pool.slots import slot_group
from driver.controller.pool.variant import Variant, offered
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricInventory

log = logging.getLogger(__name__)


class Serving(Protocol):
    """What :func:`take_up` reads of the workers (``driver.controller.attach.workers``)."""

    def served(self, a: cl.FabricAllocation) -> str: ...
    def busy(self, device_id: str) -> bool: ...
    def settling(self, device_id: str) -> bool: ...
    def settled(self, a: cl.FabricAllocation) -> bool: ...
    def adopt(self, a: cl.FabricAllocation, device_id: str) -> None: ...
    def scaling_up(self, node: str) -> bool: ...


def take_up(
    inv: FabricInventory,
    reports: Mapping[str, NodeFabric],
    allocs: Iterable[cl.FabricAllocation],
    variants: Mapping[str, Variant],
    workers: Serving,
    spares: Collection[str] = (),
) -> None:
    """Give each waiting slot allocation that holds no device yet (and whose
    attach has not started) a device of its model already attached to its
    node that nothing needs: what the manager attached for it before a
    restart lost the answer, or a released claim's leftover. It is followed
    instead of detached, and no scale-up is asked for the allocation. Never
    a warm spare (``spares``): its own variant may be allocated at any time."""
    allocs = list(allocs)
    taken = {workers.served(a) for a in allocs} | set(spares)
    taken |= {v.device_id for a in allocs if (v := variants.get(a.device)) and not v.count}
    for a in allocs:
        v = variants.get(a.device)
        if v is None or not v.count or a.ready or a.failed or workers.served(a):
            continue
        if workers.busy(v.device_id) or workers.settled(a):
            continue  # its attach runs (or ended here): it asks or has asked itself
        if workers.scaling_up(v.node):
            continue  # what is attached there may be that scale-up's: a pass follows its answer
        model, prepared = slot_group(v.device_id)[1], (reports.get(v.node) or NodeFabric()).busy
        for d in sorted(inv.devices, key=lambda d: d.id):
            conn = d.connection
            if conn is None or conn.node != v.node or conn.state not in ("Attached", "Attaching"):
                continue
            if (d.kind, d.model) != (v.kind, model) or not offered(d) or d.identity in prepared:
                continue
            if d.id in taken or workers.busy(d.id) or workers.settling(d.id):
                continue
            log.info("claim %s/%s: taking up %s, attached to %s, for slot %s", a.namespace,
                     a.name, d.id, v.node, v.device_id)  # fmt: skip
            workers.adopt(a, d.id)
            taken.add(d.id)
            break
