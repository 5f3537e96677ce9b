"""The attach of a manager that attaches the device it is asked for.

Why a module: one of the two attach models (``driver.controller.attach.model``).
A variant names its device, node and adapter; the attach asks for exactly
that once per allocation (``driver.controller.attach.connect``) and is done
when the node's plugin reports the device behind the adapter. The claim's
status data then names the device in the fabric's terms and the node's
(its identity, and a GPU's board serial where the node reports one). CXL
memory is named on the node by its memdev (``driver.controller.attach.memdevs``):
the status data names the one that arrived (``pciBusID``) and the node's own
name of it (``PREPARED_AS_KEY``), by which the node prepares that LD.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from driver.controller import claims as cl
from driver.controller.attach import memdevs
from driver.controller.attach.connect import Connector
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.serials import serial_data
from driver.controller.pool.variant import Variant, as_memdev
from driver.cxl import KIND as CXL_MEMORY
from driver.devices.model import PCI_BUS_ID
from driver.errors import AttachFailed
from driver.fabric_devices.naming import (
    IDENTITY_ATTRIBUTE,
    PREPARED_AS_KEY,
    cxl_bdf_of,
    variant_name,
)


class DeviceAttach:
    """:class:`~driver.controller.attach.model.AttachModel` for a device pool."""

    def __init__(
        self, connector: Connector, reports: NodeReports, found: memdevs.MemdevArrivals
    ) -> None:
        self._connector = connector
        self._reports = reports
        self._memdevs = found

    async def attach(
        self,
        a: cl.FabricAllocation,
        v: Variant,
        deadline: float,
        served: str,
        arrived: Callable[[str], Awaitable[None]],
    ) -> tuple[str, dict[str, str]]:
        if not v.adapter:  # a device published once: its node has no adapter that reaches it
            usual = (f"node {v.node or '(none)'} has no reported fabric adapter that "
                     f"reaches {v.device_id}: check its reach label")  # fmt: skip
            raise AttachFailed(v.why or usual)
        memdev = ""
        if v.kind == CXL_MEMORY:
            deadline, memdev = await self._attach_memdev(a, v, deadline)
        else:
            deadline = await self._connector.connect(a, v, deadline)
            if not await self._reports.wait_until(
                lambda: self._reports.sees(v.node, v.kind, v.identity, v.adapter), deadline
            ):
                raise AttachFailed(f"node {v.node} did not report {v.kind} {v.identity} in time")
        message = f"{v.device_id} attached to {v.node} via {v.adapter}"
        key = IDENTITY_ATTRIBUTE[v.kind]
        data = {"fabricDevice": v.device_id, key: v.identity, "adapter": v.adapter}
        # Published once (per-domain), or under a name the node cannot compute (a
        # CXL logical device, named by its memdev on the node; docs/fabric.md
        # "Logical devices"): the node prepares it as its own name of the device.
        own = variant_name(memdev or v.identity, v.node, v.adapter, v.kind)
        if v.once or (v.kind == CXL_MEMORY and own != v.name):
            data[PREPARED_AS_KEY] = own
        if memdev:
            data[PCI_BUS_ID] = cxl_bdf_of(memdev)
        return message, data | serial_data(self._reports.get(v.node), v.kind, v.identity)

    async def _attach_memdev(
        self, a: cl.FabricAllocation, v: Variant, deadline: float
    ) -> tuple[float, str]:
        """Attach CXL memory ``v``, one LD of its serial to its node at a time;
        (the deadline, the key of the memdev it is there), noted for it."""
        seen: list[frozenset[str]] = []  # before the (last) request, if one was made

        def asking() -> None:
            self._memdevs.forget(v.device_id)
            seen[:] = [memdevs.before(self._reports.get(v.node), v.identity, v.adapter)]

        async with self._memdevs.one_at_a_time(v.node, v.identity):
            deadline = await self._connector.connect(a, v, deadline, asking)
            memdev = await self._memdev(v, seen[0] if seen else None, deadline)
        self._memdevs.note(v.device_id, memdev)
        return deadline, memdev

    def _arrived(self, v: Variant, seen: frozenset[str] | None) -> str:
        """The memdev the attach of ``v`` brought (``memdevs.arrived``), or with
        no request made the one it was noted or published as (``adopted``)."""
        report = self._reports.get(v.node)
        if seen is None:
            return self._memdevs.adopted(report, v.device_id, v.identity, v.adapter, v.memdev)
        return memdevs.arrived(report, v.identity, v.adapter, seen)

    async def _memdev(self, v: Variant, seen: frozenset[str] | None, deadline: float) -> str:
        """The node's key of the memdev the attach of CXL memory ``v`` brought
        (:meth:`_arrived`); "" from an older plugin, which reports the serial."""

        def decided() -> bool:
            report = self._reports.get(v.node)
            if self._arrived(v, seen):
                return True
            return self._reports.sees(v.node, v.kind, v.identity, v.adapter) and not (
                memdevs.undecided(report, v.identity, v.adapter)
            )

        if not await self._reports.wait_until(decided, deadline):
            shown = memdevs.undecided(self._reports.get(v.node), v.identity, v.adapter)
            if len(shown) > 1:
                raise AttachFailed(
                    f"node {v.node} shows {len(shown)} CXL memdevs of serial {v.identity} "
                    f"behind {v.adapter} ({', '.join(shown)}): which one is {v.device_id} "
                    "cannot be told (no one of them alone arrived since its attach was asked)"
                )
            raise AttachFailed(f"node {v.node} did not report {v.kind} {v.identity} in time")
        return self._arrived(v, seen)

    async def attach_spare(
        self, a: cl.FabricAllocation, v: Variant, deadline: float, arrived: Callable[[str], None]
    ) -> tuple[Variant, float]:
        """A spare of CXL memory comes back as the memdev it is on its node
        (``as_memdev``: published under that name, by which the node prepares it)."""
        if v.kind != CXL_MEMORY:
            return v, await self._connector.connect(a, v, deadline)
        deadline, memdev = await self._attach_memdev(a, v, deadline)
        return as_memdev(v, memdev), deadline

    def failure_data(self, v: Variant) -> dict[str, str] | None:
        return None
