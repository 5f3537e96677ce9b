"""Attach for a count-based manager's slot: ask for one of the model, follow what arrives.

Why a module: an allocated slot (``driver.controller.pool.slots``) names a
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

CXL memory is named on the node by its memdev (``<serial>@<BDF>``), and the
logical devices of one MLD share the serial the manager answers with: a CXL
ask is one per node at a time, notes the node's memdevs just before the
request and takes the new one of the serial that arrived
(:func:`arrived_memdev`, noted in ``attach.memdevs``); the device is the one
of that serial newly attached to the node (:func:`answered`).

The manager attaches before it answers, so for a moment the fabric shows
the device on the node, named by nothing: a pass then would detach it as
a leftover (or give it to another allocation) and the claim would be made
Ready on a device already gone. Each scale-up is therefore asked inside
``asking(node)`` (``Expectations.asking``), which holds until the worker
has recorded what arrived; meanwhile nothing attached to that node is
detached or taken up.

A restart must not lose what arrived: the worker writes the device into the
claim's status (``fabricDevice``, ``FabricDeviceReady=False``) as soon as
the manager named it, before waiting for the node, and a restarted attach
follows that device instead of asking again. For the moment between the
answer and that write (or an answer the controller never read),
:func:`take_up` gives a waiting allocation a device of its model already
attached to its node that nothing needs, instead of it being detached as a
leftover and asked for again (``driver.controller.pool.slot_serving``).

:class:`SlotAttach` is this fabric's attach model
(``driver.controller.attach.model``); a ready spare's device variant,
published in a count pool too, is attached as any device is
(``driver.controller.attach.device_attach``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager

from driver.backoff import Backoff
from driver.controller import claims as cl
from driver.controller.attach.device_attach import DeviceAttach
from driver.controller.attach.memdevs import MemdevArrivals
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.serials import serial_data
from driver.controller.pool.slots import slot_group
from driver.controller.pool.variant import Variant, as_memdev
from driver.cxl import KIND as CXL_MEMORY
from driver.devices.model import PCI_BUS_ID
from driver.errors import AttachFailed, FabricUnavailable
from driver.fabric_devices.naming import (
    IDENTITY_ATTRIBUTE,
    PREPARED_AS_KEY,
    NodeFabric,
    cxl_bdf_of,
    cxl_serial_of,
    variant_name,
)
from driver.fabricclient.model import AttachResult, FabricDevice, FabricInventory
from driver.fabricclient.protocol import FabricApi
from driver.faults import crash_point

log = logging.getLogger(__name__)
RETRY_S, RETRY_CAP_S = 0.5, 5.0
ANY_SERIAL = ""  # a count manager picks the device: CXL asks are one per node at a time
# A scale-up for a node under way, until what arrived is recorded (Expectations.asking).
Asking = Callable[[str], AbstractContextManager[None]]


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
    served: str,
    arrived: Callable[[str], Awaitable[None]],
    asking: Asking,
    found: MemdevArrivals,
) -> tuple[str, dict[str, str]]:
    """Attach one device for slot ``v``; (its fabric device id, the claim's
    status data). ``served``: the device this allocation already holds (named
    on the claim, or taken up by :func:`take_up`): followed, not asked again
    while it is attached to the slot's node. ``arrived(device_id)`` runs as
    soon as the manager named a device, before anything else is done with it
    (the worker records it on the claim: from then on it is this
    allocation's, also across a restart), inside ``asking(v.node)`` with
    the request. CXL memory: one ask per node at a time, and the memdev that
    arrived is the one the claim's status names (:func:`arrived_memdev`)."""
    cxl = v.kind == CXL_MEMORY
    async with found.one_at_a_time(v.node, ANY_SERIAL) if cxl else contextlib.nullcontext():
        seen: list[frozenset[str]] = []  # the node's CXL memdevs before the request

        def noting() -> None:
            seen[:] = [frozenset((reports.get(v.node) or NodeFabric()).cxlmem)]

        device = None
        if served:  # read only then: the ask reads the inventory itself
            device = next((d for d in (await fabric.inventory()).devices if d.id == served), None)
        conn = device.connection if device is not None else None
        if device is not None and conn is not None and conn.node == v.node:
            what = f"serial {device.serial or '?'}, attached before"
            log.info("slot %s on %s: following %s (%s)", v.device_id, v.node, device.id, what)
        else:
            device, what = await _ask(fabric, a, v, deadline, arrived, asking, noting)
        kind, ident = device.kind, device.identity
        memdev = ""
        if kind == CXL_MEMORY:
            memdev = await arrived_memdev(reports, found, device, v, seen, deadline, what)
        elif not await reports.wait_until(
            lambda: ident in (reports.get(v.node) or NodeFabric()).attached(kind), deadline
        ):
            raise AttachFailed(f"node {v.node} did not report {kind} {ident} ({what}) in time")
    report = reports.get(v.node)
    attached = report.attached(kind) if report is not None else {}
    adapter = attached.get(memdev or ident, v.adapter)
    data = {"fabricDevice": device.id, IDENTITY_ATTRIBUTE[kind]: ident, "adapter": adapter}
    data |= serial_data(report, kind, ident)
    data[PREPARED_AS_KEY] = variant_name(memdev or ident, v.node, adapter, kind)
    if memdev:
        data[PCI_BUS_ID] = cxl_bdf_of(memdev)
    return device.id, data


async def arrived_memdev(
    reports: NodeReports, found: MemdevArrivals, device: FabricDevice, v: Variant,
    seen: list[frozenset[str]], deadline: float, what: str,
) -> str:  # fmt: skip
    """The node's key of the memdev CXL memory ``device`` arrived as on ``v``'s
    node (noted for it): the one of its serial not there before the request
    (``seen``, every CXL memdev of the node then); with no request made, the
    one it was noted as or alone with its serial behind its adapter
    (``MemdevArrivals.adopted``); "" from an older plugin (serials only)."""
    serial = device.identity
    adapter = device.connection.adapter if device.connection is not None else v.adapter

    def candidates(report: NodeFabric) -> list[str]:
        keys = [k for k in sorted(report.cxlmem) if cxl_bdf_of(k) and cxl_serial_of(k) == serial]
        return [k for k in keys if k not in seen[0]] if seen else keys

    def pick() -> str:
        report = reports.get(v.node)
        if report is None:
            return ""
        if not seen:
            return found.adopted(report, device.id, serial, adapter)
        new = candidates(report)
        return new[0] if len(new) == 1 else ""

    def decided() -> bool:
        report = reports.get(v.node)
        older = report is not None and serial in report.cxlmem and not candidates(report)
        return bool(pick()) or older

    if not await reports.wait_until(decided, deadline):
        shown = candidates(reports.get(v.node) or NodeFabric())
        if len(shown) > 1:
            raise AttachFailed(
                f"node {v.node} shows {len(shown)} CXL memdevs of serial {serial} "
                f"({', '.join(shown)}): which one is {device.id} ({what}) cannot be told"
            )
        raise AttachFailed(f"node {v.node} did not report {device.kind} {serial} ({what}) in time")
    memdev = pick()
    found.note(device.id, memdev)
    return memdev


async def _ask(
    fabric: FabricApi,
    a: cl.FabricAllocation,
    v: Variant,
    deadline: float,
    arrived: Callable[[str], Awaitable[None]],
    asking: Asking,
    noting: Callable[[], None] = lambda: None,
) -> tuple[FabricDevice, str]:
    """One scale-up for slot ``v``: the device that arrived (recorded by
    ``arrived``), and how the manager named it; ``noting`` runs just before
    the request."""
    backoff = Backoff(RETRY_S, RETRY_CAP_S)
    while True:
        cause: FabricUnavailable | None = None  # the failure's case (attach.cases)
        try:
            inv = await fabric.inventory()
            through = asked_through(inv, v)
            if through is not None:
                # Only the request and its record: waiting for a free device
                # (above) must not keep a leaving one on this node attached.
                with asking(v.node):
                    noting()
                    result = await fabric.attach(through.id, v.node, v.adapter, a.claim_uid)
                    crash_point("fabric-attach-answered")
                    now = await fabric.inventory() if _shared_serial(inv, result) else None
                    device, what = answered(inv, result, f"slot {v.device_id} on {v.node}", now)
                    await arrived(device.id)
                return device, what
            why = "no free device of its model yet (one may still be leaving)"
        except FabricUnavailable as exc:
            why, cause = f"fabric unusable: {exc}", exc
        if time.monotonic() > deadline:
            raise AttachFailed(f"slot {v.device_id}: {why}") from cause
        log.info("slot %s: %s: retry in %.1fs", v.device_id, why, backoff.delay)
        await backoff.sleep()


def _shared_serial(inv: FabricInventory, result: AttachResult) -> bool:
    """Whether the serial the manager named is several devices' (the LDs of a CXL MLD)."""
    got = result.arrived
    return got is not None and sum(1 for d in inv.devices if d.serial == got.serial) > 1


def answered(
    inv: FabricInventory, result: AttachResult, what: str, now: FabricInventory | None = None
) -> tuple[FabricDevice, str]:
    """The device a scale-up for ``what`` brought (by its board serial), and
    how the manager named it; of several with that serial (the LDs of one
    MLD), the one attached in ``now`` (read after the answer) that was not in
    ``inv`` (read before the request)."""
    got = result.arrived
    if got is None:
        raise AttachFailed(f"{what}: the fabric named no device that arrived")
    device = next((d for d in inv.devices if got.serial and d.serial == got.serial), None)
    if now is not None:
        before = {d.id for d in inv.devices if d.connection is not None}
        new = [d for d in now.devices if d.serial == got.serial and d.connection is not None]
        new = [d for d in new if d.id not in before]
        device = new[0] if len(new) == 1 else None
    if device is None:
        raise AttachFailed(f"{got.describe()} arrived: no device of the fabric has that serial")
    log.info("%s: the manager chose %s (%s)", what, device.id, got.describe())
    return device, got.describe()


async def ask_spare(
    fabric: FabricApi, v: Variant, key: str, noting: Callable[[], None] = lambda: None
) -> FabricDevice:
    """One scale-up for a warm spare of ``v``'s model on ``v``'s node (asked
    through ``v``'s free device, which names the model): the device that
    arrived, which the spare keeper keeps (``driver.controller.pool.slot_spares``);
    ``noting`` runs just before the request."""
    before = await fabric.inventory()
    noting()
    result = await fabric.attach(v.device_id, v.node, v.adapter, key)
    now = await fabric.inventory()
    what = f"spare for {v.node}"
    if _shared_serial(now, result):  # an LD of an MLD: the one that is new
        return answered(before, result, what, now)[0]
    return answered(now, result, what)[0]


class SlotAttach:
    """:class:`~driver.controller.attach.model.AttachModel` for a count pool."""

    def __init__(
        self, fabric: FabricApi, reports: NodeReports, devices: DeviceAttach, asking: Asking,
        found: MemdevArrivals,
    ) -> None:  # fmt: skip
        self._fabric = fabric
        self._reports = reports
        self._devices = devices
        self._asking = asking
        self._found = found

    async def attach(
        self,
        a: cl.FabricAllocation,
        v: Variant,
        deadline: float,
        served: str,
        arrived: Callable[[str], Awaitable[None]],
    ) -> tuple[str, dict[str, str]]:
        if not v.count:  # a ready spare's own variant: its device is named
            return await self._devices.attach(a, v, deadline, served, arrived)
        got, data = await attach_slot(
            self._fabric, self._reports, a, v, deadline, served, arrived, self._asking,
            self._found,
        )  # fmt: skip
        return f"{got} attached to {v.node} via {data['adapter']} for {v.device_id}", data

    async def attach_spare(
        self, a: cl.FabricAllocation, v: Variant, deadline: float, arrived: Callable[[str], None]
    ) -> tuple[Variant, float]:
        """The manager picks: the spare is what arrives (asked through ``v``'s
        device); CXL memory as the memdev it arrived as (``as_memdev``)."""
        cxl = v.kind == CXL_MEMORY
        async with (
            self._found.one_at_a_time(v.node, ANY_SERIAL) if cxl else contextlib.nullcontext()
        ):
            seen: list[frozenset[str]] = []

            def noting() -> None:
                seen[:] = [frozenset((self._reports.get(v.node) or NodeFabric()).cxlmem)]

            with self._asking(v.node):
                got = await ask_spare(self._fabric, v, a.claim_uid, noting)
                arrived(got.id)
            adapter = got.connection.adapter if got.connection else v.adapter
            name = variant_name(got.identity, v.node, adapter, got.kind)
            got_v = dataclasses.replace(
                v, name=name, device_id=got.id, identity=got.identity, adapter=adapter
            )
            if got.kind == CXL_MEMORY:
                found, what = self._found, f"spare for {v.node}"
                memdev = await arrived_memdev(self._reports, found, got, v, seen, deadline, what)
                got_v = as_memdev(got_v, memdev)
        return got_v, deadline

    def failure_data(self, v: Variant) -> dict[str, str] | None:
        """A slot's device that arrived is gone: its name leaves the claim."""
        return {} if v.count else None
