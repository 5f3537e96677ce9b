"""Reading a fabric's inventory from standard Redfish resources.

Why a module: this is where the client turns a fabric manager's resource
tree into devices, host adapters and their reachability. For each Fabric:

- endpoints whose ``ConnectedEntities[].EntityRole`` is Initiator are host
  adapters. Their node: the setting ``fabric_systems`` maps a node to a
  ComputerSystem (its Id or UUID) where the system has no usable HostName
  (many nodes on one machine, as in our simulator, or a manager that does
  not know host names); else the linked system's ``HostName``; else the
  Node whose ``systemUUID`` is the system's ``UUID`` (the controller tells
  the client those, unique ones only); else "" (its ``UUID`` is reported).
  The adapter is the FabricAdapter Id in the endpoint's ``Links.LocalPorts``
  (``Ports`` before Endpoint v1_7_0; ``.../FabricAdapters/<id>/Ports/<p>``),
  else
  the endpoint's own Id;
- Target endpoints are devices when :mod:`identity` can say what they are
  (``NVMeOverFabrics`` endpoints are listed apart, by NQN: parse only);
- a device is reachable from every initiator on its switch: the switch in
  its ``Links.ConnectedPorts`` (``.../Switches/<sw>/Ports/<p>``), else the
  switch whose port lists the endpoint (``AssociatedEndpoints``) or is
  connected to the endpoint's own port;
- attachments come from the dialect (Connections, or zone members);
  Storage connections' volumes are listed (NVMe-oF: parse only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from pydantic import BaseModel, Field, field_validator

from driver.fabricclient import wire
from driver.fabricclient.dialect import Dialect
from driver.fabricclient.identity import Identity, identify
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import (
    FabricConnection,
    FabricDevice,
    FabricInventory,
    FabricVolume,
    HostAdapter,
    NqnEndpoint,
)

ROOT = "/redfish/v1"
NVME_OF = "NVMeOverFabrics"


class FabricSystemsSetting(BaseModel):
    fabric_systems: str = Field(
        default="",
        description="nodes on the fabric's ComputerSystems as 'node=system,...' (system: its "
        "Id or UUID), for systems whose HostName is not the node name; unset: HostName",
    )

    @field_validator("fabric_systems")
    @classmethod
    def _pairs(cls, value: str) -> str:
        system_nodes(value)
        return value

    def system_nodes(self) -> dict[str, str]:
        return system_nodes(self.fabric_systems)


def system_nodes(text: str) -> dict[str, str]:
    """``node=system,...`` as system -> node (ValueError naming a bad or repeated pair)."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        node, sep, system = (s.strip() for s in pair.partition("="))
        if not sep or not node or not system:
            raise ValueError(f"fabric_systems: {pair!r} is not node=system")
        if system.lower() in out:
            raise ValueError(f"fabric_systems: system {system} given twice")
        out[system.lower()] = node
    return out


def _key(uri: str) -> str:
    return uri.rstrip("/")


def system_of(uri: str) -> str:
    """``/redfish/v1/Systems/<id>`` of a URI under a system, or ""."""
    sid = wire.segment_after(uri, "Systems")
    return f"{ROOT}/Systems/{sid}" if sid else ""


def switch_of(uri: str) -> str:
    sw = wire.segment_after(uri, "Switches")
    return sw if sw and "/Ports/" in uri else ""


class InventoryReader:
    def __init__(self, dialect: Dialect, systems: Mapping[str, str]) -> None:
        self.dialect = dialect
        self._systems = {k.lower(): v for k, v in systems.items()}
        # System UUID -> node, learned from the Nodes' systemUUID (the controller's
        # set_node_uuids): the last resort, after the mapping and HostName.
        self.node_uuids: dict[str, str] = {}

    async def read(self, links: Links, fabrics_uri: str) -> FabricInventory:
        parts = await asyncio.gather(
            *(self._fabric(links, parse(wire.Fabric, f, fabrics_uri))
              for f in await links.members(fabrics_uri))
        )  # fmt: skip
        return FabricInventory(
            tuple(d for p in parts for d in p.devices),
            tuple(a for p in parts for a in p.adapters),
            tuple(e for p in parts for e in p.nqn_endpoints),
            tuple(v for p in parts for v in p.volumes),
        )

    async def _fabric(self, links: Links, fab: wire.Fabric) -> FabricInventory:
        where = fab.endpoints.odata_id if fab.endpoints else ""
        eps = [parse(wire.Endpoint, m, where) for m in await links.members(where)] if where else []
        switches = await self._switches(links, fab, eps)
        nqn = tuple(NqnEndpoint(e.id, fab.id, e.role(), wire.durable(e.identifiers, "NQN"))
                    for e in eps if e.protocol == NVME_OF)  # fmt: skip
        ini_eps = [e for e in eps if e.role() in ("Initiator", "Both") and e.protocol != NVME_OF]
        adapters = list(
            await asyncio.gather(*(self._adapter(links, fab.id, e, switches) for e in ini_eps))
        )
        by_uri = {e.odata_id.rstrip("/"): a for e, a in zip(ini_eps, adapters, strict=True)}
        targets = [e for e in eps if e.role() in ("Target", "Both") and e.protocol != NVME_OF]
        found = await asyncio.gather(*(identify(links, e) for e in targets))
        conns = {c.device: c for c in await self.dialect.connections(links, fab, by_uri)}
        devices = tuple(
            _device(fab.id, e, i, switches.get(_key(e.odata_id), ""), adapters, conns.get(e.id))
            for e, i in zip(targets, found, strict=True)
            if i is not None
        )
        volumes = await self._volumes(links, fab)
        return FabricInventory(devices, tuple(adapters), nqn, volumes)

    async def _switches(
        self, links: Links, fab: wire.Fabric, eps: list[wire.Endpoint]
    ) -> dict[str, str]:
        """Endpoint URI -> switch Id."""
        out: dict[str, str] = {}
        for e in eps:
            named = next(filter(None, (switch_of(p.odata_id) for p in e.links.connected_ports)), "")
            if named:
                out[_key(e.odata_id)] = named
        if len(out) == len(eps) or fab.switches is None:
            return out
        own_port = {_key(p.odata_id): _key(e.odata_id) for e in eps for p in e.links.ports}
        for sw_body in await links.members(fab.switches.odata_id):
            sw = parse(wire.Switch, sw_body, fab.switches.odata_id)
            if sw.ports is None:
                continue
            ports_uri = sw.ports.odata_id
            for p in await links.members(ports_uri):
                port = parse(wire.Port, p, ports_uri)
                ends = [_key(x.odata_id) for x in port.links.associated_endpoints]
                peers = [_key(c.odata_id) for c in port.links.connected_ports]
                ends += [own_port[c] for c in peers if c in own_port]
                for end in ends:
                    out.setdefault(end, sw.id)
        return out

    async def _adapter(
        self, links: Links, fabric: str, e: wire.Endpoint, switches: Mapping[str, str]
    ) -> HostAdapter:
        refs = [x.link.odata_id for x in e.entities if x.role in ("Initiator", "Both") and x.link]
        refs += [p.odata_id for p in e.links.ports]
        system_uri = next(filter(None, (system_of(r) for r in refs)), "")
        system = wire.System()
        if system_uri:
            system = await links.model(wire.System, system_uri, e.odata_id)
        mapped = self._systems.get(system.id.lower()) or self._systems.get(
            (system.uuid or "").lower()
        )
        node = mapped or system.host_name or self.node_uuids.get((system.uuid or "").lower(), "")
        adapter = next(
            filter(None, (wire.segment_after(p.odata_id, "FabricAdapters") for p in e.links.ports)),
            e.id,
        )
        return HostAdapter(e.id, fabric, switches.get(e.odata_id.rstrip("/"), ""), node, adapter,
                           system.uuid or "", e.odata_id)  # fmt: skip

    async def _volumes(self, links: Links, fab: wire.Fabric) -> tuple[FabricVolume, ...]:
        if fab.connections is None:
            return ()
        where, out = fab.connections.odata_id, []
        for body in await links.members(where):
            c = parse(wire.Connection, body, where)
            inis = tuple(wire.last_segment(i.odata_id) for i in c.links.initiators)
            for info in c.volumes:
                if info.volume is not None:
                    v = await links.model(wire.Volume, info.volume.odata_id, c.odata_id)
                    nguid = wire.durable(v.identifiers, "NGUID")
                    out.append(FabricVolume(v.odata_id, v.capacity_bytes, nguid, inis))
        return tuple(out)


def _device(
    fabric: str, e: wire.Endpoint, i: Identity, switch: str, adapters: list[HostAdapter],
    conn: FabricConnection | None,
) -> FabricDevice:  # fmt: skip
    return FabricDevice(
        e.id, fabric, switch, i.kind, i.model, i.serial, i.uuid, i.vendor_id, i.device_id,
        e.status.health or "OK", e.status.state != "UnavailableOffline",
        conn is not None and conn.state == "Attached",
        tuple(a for a in adapters if switch and a.switch == switch), conn, i.mac,
        i.capacity_bytes, i.nqn, e.odata_id,
    )  # fmt: skip
