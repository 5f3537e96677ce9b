"""How a fabric manager is asked to attach: the dialect seam, and its setting.

Why a module: fabric managers that serve the same standard inventory attach
in different ways. DMTF's ``Fabric/Connections`` (POST a Connection,
DELETE it) is one; a Zone per host port whose ``Links.Endpoints`` is
PATCHed (H3 Platform's managers) is another. Each dialect is a small module
behind :class:`Dialect` (``dialect_connections``, ``dialect_zones``,
``dialect_count`` for managers that pick the device themselves); the
setting ``fabric_dialect`` picks one for the fabric the controller talks to.
A dialect also says where the current attachments are read from (the
Connections, or the zones' members), since that is the same choice.

Every attach request carries an ``Idempotency-Key`` header (not a Redfish
standard: a manager that honours it, as our simulator does, answers a
repeat with its first answer instead of attaching twice). The key is
derived from the device, node, adapter and the caller's key (the
controller's allocation), so a retry of one allocation repeats it and a
later allocation of the same device does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from driver.fabricclient import wire
from driver.fabricclient.links import Links
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricTask,
    HostAdapter,
)
from driver.fabricclient.operations import Operations

DialectName = Literal["connections", "zones", "count"]
IDEMPOTENCY_HEADER = "Idempotency-Key"


def idempotency_key(device: str, node: str, adapter: str, key: str = "") -> str:
    """The same for the same attach request (device, node, adapter, caller's key)."""
    return hashlib.sha256("\0".join((device, node, adapter, key)).encode()).hexdigest()[:32]


class Dialect(Protocol):
    name: str
    # Whether the manager picks which device of a model it attaches (then the
    # controller's pool offers model slots, driver.controller.pool.model).
    picks_devices: bool

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """The cluster's Nodes as the apiserver lists them, on every pass."""
        ...

    async def connections(
        self, links: Links, fabric: wire.Fabric, initiators: Mapping[str, HostAdapter]
    ) -> list[FabricConnection]:
        """The attachments of ``fabric``; ``initiators`` by endpoint URI."""
        ...

    async def attach(
        self, ops: Operations, links: Links, dev: FabricDevice, via: HostAdapter, key: str
    ) -> AttachResult:
        """Ask once to attach ``dev`` through ``via``; ``key``: the Idempotency-Key."""
        ...

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        """Ask to detach ``dev`` from its connection (``dev.connection`` is set)."""
        ...


class FabricDialectSetting(BaseModel):
    fabric_dialect: DialectName = Field(
        default="connections",
        description="how the fabric manager attaches: connections (POST/DELETE "
        "Fabric/Connections, DMTF), zones (PATCH the host port's Zone Links.Endpoints) or "
        "count (one device of a model to a machine, the manager picks it: dialect_count)",
    )

    def dialect(self) -> Dialect:
        return make_dialect(self.fabric_dialect)


def make_dialect(name: DialectName) -> Dialect:
    from driver.fabricclient.dialect_connections import ConnectionsDialect
    from driver.fabricclient.dialect_zones import ZonesDialect

    if name == "count":  # needs its settings: FabricCountSettings.dialect()
        raise ValueError("fabric_dialect count: build it from FabricCountSettings.dialect()")
    return ConnectionsDialect() if name == "connections" else ZonesDialect()


def link(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}
