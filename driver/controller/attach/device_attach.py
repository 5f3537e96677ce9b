"""The attach of a manager that attaches the device it is asked for.

Why a module: one of the two attach models (``driver.controller.attach.model``).
A variant names its device, node and adapter; the attach asks for exactly
that once per allocation (``driver.controller.attach.connect``) and is done
when the node's plugin reports the device behind the adapter. The claim's
status data then names the device in the fabric's terms and the node's
(its identity, and a GPU's board serial where the node reports one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from driver.controller import claims as cl
from driver.controller.attach.connect import Connector
from driver.controller.attach.reports import NodeReports
from driver.controller.attach.serials import serial_data
from driver.controller.pool.variant import Variant
from driver.cxl import KIND as CXL_MEMORY
from driver.errors import AttachFailed
from driver.fabric_devices.naming import IDENTITY_ATTRIBUTE, PREPARED_AS_KEY, variant_name


class DeviceAttach:
    """:class:`~driver.controller.attach.model.AttachModel` for a device pool."""

    def __init__(self, connector: Connector, reports: NodeReports) -> None:
        self._connector = connector
        self._reports = reports

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
        deadline = await self._connector.connect(a, v, deadline)
        if not await self._reports.wait_until(
            lambda: self._reports.sees(v.node, v.kind, v.identity, v.adapter), deadline
        ):
            raise AttachFailed(f"node {v.node} did not report {v.kind} {v.identity} in time")
        message = f"{v.device_id} attached to {v.node} via {v.adapter}"
        key = IDENTITY_ATTRIBUTE[v.kind]
        data = {"fabricDevice": v.device_id, key: v.identity, "adapter": v.adapter}
        # Published once (per-domain), or under a name the node cannot compute (a
        # CXL logical device other than 0, named with its LD id: the node sees
        # only the serial, docs/fabric.md "Logical devices"): the node prepares
        # it as its own name of the device.
        own = variant_name(v.identity, v.node, v.adapter, v.kind)
        if v.once or (v.kind == CXL_MEMORY and own != v.name):
            data[PREPARED_AS_KEY] = own
        return message, data | serial_data(self._reports.get(v.node), v.kind, v.identity)

    async def attach_spare(
        self, a: cl.FabricAllocation, v: Variant, deadline: float, arrived: Callable[[str], None]
    ) -> tuple[Variant, float]:
        return v, await self._connector.connect(a, v, deadline)

    def failure_data(self, v: Variant) -> dict[str, str] | None:
        return None
