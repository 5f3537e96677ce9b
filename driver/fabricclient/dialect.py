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

What the dialects share (the :class:`~attachment.Binding` they read, the
``Idempotency-Key`` every attach request carries, a binding's progress)
lives below them in :mod:`attachment`, so this seam imports the dialects
and none of them imports it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from driver.fabricclient import wire
from driver.fabricclient.attachment import Binding
from driver.fabricclient.dialect_connections import ConnectionsDialect
from driver.fabricclient.dialect_zones import ZonesDialect
from driver.fabricclient.links import Links
from driver.fabricclient.model import AttachResult, FabricDevice, FabricTask, HostAdapter
from driver.fabricclient.operations import Operations

DialectName = Literal["connections", "zones", "count"]


class Dialect(Protocol):
    name: str
    # Whether the manager picks which device of a model it attaches (then the
    # controller's pool offers model slots, driver.controller.pool.model).
    picks_devices: bool

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """The cluster's Nodes as the apiserver lists them, on every pass."""
        ...

    async def bindings(self, links: Links, fabric: wire.Fabric) -> list[Binding]:
        """Every attachment of ``fabric`` as the manager shows it (tolerant: a
        binding that cannot be read is recorded in ``links.broken``)."""
        ...

    async def named(self, links: Links, eps: list[wire.Endpoint], known: set[str]) -> list[Binding]:
        """The bindings endpoints ``eps`` link (``Links.Connections``, ``Links.Zones``)
        beyond those ``known`` (URIs): ones their collection omits."""
        ...

    async def attach(
        self, ops: Operations, links: Links, dev: FabricDevice, via: HostAdapter, key: str
    ) -> AttachResult:
        """Ask once to attach ``dev`` through ``via``; ``key``: the Idempotency-Key."""
        ...

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        """Ask to remove every binding of ``dev`` to the node of ``dev.connection``
        (set); one handle for all of them (``Operations.combine``), None when done."""
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
    if name == "count":  # needs its settings: FabricCountSettings.dialect()
        raise ValueError("fabric_dialect count: build it from FabricCountSettings.dialect()")
    return ConnectionsDialect() if name == "connections" else ZonesDialect()
