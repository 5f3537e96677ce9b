"""Attach for a count-based manager's slot: ask for one of the model, follow what arrives.

Why a module: an allocated slot (``driver.controller.count_pool``) names a
switch, model, node and adapter, not a device. The controller asks the
manager for one device of that model on the node's machine (the ``count``
dialect's scale-up, through any free device of the slot's group as the
request's model and type), and the manager answers with the device it chose,
by its board serial. That serial names the physical device in the fabric
inventory; the attach then waits until the node reports that device and
hands back the claim's status data: the device (``fabricDevice``), its
identity (GPU UUID), the adapter it came through, the board serial, and the
node's own variant name of it (``PREPARED_AS_KEY``), by which the node
plugin prepares the allocated slot. Another model, a Critical device or
nothing arriving fails in the dialect, naming what arrived.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from driver.backoff import Backoff
from driver.controller import claims as cl
from driver.controller.count_identity import serial_data
from driver.controller.count_pool import slot_group
from driver.controller.pool import Variant
from driver.controller.reports import NodeReports
from driver.errors import AttachFailed, FabricUnavailable
from driver.fabric_devices.naming import (
    IDENTITY_ATTRIBUTE,
    PREPARED_AS_KEY,
    NodeFabric,
    variant_name,
)
from driver.fabricclient.dialect_count import CountAttachResult
from driver.fabricclient.model import FabricDevice, FabricInventory
from driver.fabricclient.protocol import FabricApi

log = logging.getLogger(__name__)
RETRY_S, RETRY_CAP_S = 0.5, 5.0


def asked_through(inv: FabricInventory, v: Variant) -> FabricDevice | None:
    """A free device of ``v``'s group that ``v``'s node and adapter reach: the
    request's type and model (the manager picks the device itself); None while
    every one is attached (one may be leaving a released claim)."""
    switch, model = slot_group(v.device_id)
    for d in sorted(inv.devices, key=lambda d: d.id):
        reach = any((a.node, a.adapter) == (v.node, v.adapter) for a in d.adapters)
        if (d.switch, d.kind, d.model) == (switch, v.kind, model) and reach and not d.connection:
            return d
    return None


async def attach_slot(
    fabric: FabricApi,
    reports: NodeReports,
    a: cl.FabricAllocation,
    v: Variant,
    deadline: float,
    arrived: Callable[[str], None],
) -> tuple[str, dict[str, str]]:
    """Attach one device for slot ``v``; (its fabric device id, the claim's
    status data). ``arrived(device_id)`` runs as soon as the manager named it
    (from then on the device is this allocation's, not a leftover to detach)."""
    backoff = Backoff(RETRY_S, RETRY_CAP_S)
    while True:
        try:
            inv = await fabric.inventory()
            through = asked_through(inv, v)
            if through is not None:
                result = await fabric.attach(through.id, v.node, v.adapter, a.claim_uid)
                break
            why = "no free device of its model yet (one may still be leaving)"
        except FabricUnavailable as exc:
            why = f"fabric unusable: {exc}"
        if time.monotonic() > deadline:
            raise AttachFailed(f"slot {v.device_id}: {why}")
        log.info("slot %s: %s: retry in %.1fs", v.device_id, why, backoff.delay)
        await backoff.sleep()
    got = result.arrived if isinstance(result, CountAttachResult) else None
    if got is None:
        raise AttachFailed(f"slot {v.device_id}: the fabric named no device that arrived")
    device = next((d for d in inv.devices if got.serial and d.serial == got.serial), None)
    if device is None:
        raise AttachFailed(f"{got.describe()} arrived: no device of the fabric has that serial")
    arrived(device.id)
    kind, ident = device.kind, device.identity
    if not await reports.wait_until(
        lambda: ident in (reports.get(v.node) or NodeFabric()).attached(kind), deadline
    ):
        what = f"{kind} {ident} ({got.describe()})"
        raise AttachFailed(f"node {v.node} did not report {what} in time")
    report = reports.get(v.node)
    adapter = report.attached(kind)[ident] if report is not None else v.adapter
    data = {"fabricDevice": device.id, IDENTITY_ATTRIBUTE[kind]: ident, "adapter": adapter}
    data |= serial_data(report, kind, ident)
    data[PREPARED_AS_KEY] = variant_name(ident, v.node, adapter, kind)
    log.info("slot %s on %s: the manager chose %s (%s)", v.device_id, v.node, device.id,
             got.describe())  # fmt: skip
    return device.id, data
