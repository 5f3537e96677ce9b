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
- a device is reachable from every initiator whose switch its switch joins
  through inter-switch links (:mod:`reach`); an initiator's room is the
  vPPB count of the virtual switch its port is bound to (:mod:`room`);
- attachments come from the dialect (Connections, or zone members), every
  one of them: a device keeps all its bindings (``FabricDevice.connections``,
  the attached one first as ``connection``), an initiator another host's;
  endpoints a binding names that the Endpoints collection omits are read by
  their URI. Storage connections' volumes are listed (NVMe-oF: parse only),
  once per volume with every initiator that any connection grants it to.

A broken resource costs what depends on it only (``Links`` tolerant reads):
its URI and why are in ``FabricInventory.broken``; a device whose endpoint
or identity is unreadable, or that a broken binding may name (one its
endpoint links; any, on a fabric whose endpoints link no bindings), is held
back (``FabricInventory.held_back``, its reason), and the rest is listed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from driver.errors import FabricApiError, FabricMalformed, FabricResourceBroken
from driver.fabricclient import wire
from driver.fabricclient.attachment import Binding, key
from driver.fabricclient.dialect import Dialect
from driver.fabricclient.dialect_connections import binding, connections_in
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
from driver.fabricclient.reach import Graph, read_graph
from driver.fabricclient.room import read_rooms
from driver.fabricclient.systems import FabricSystemsSetting as FabricSystemsSetting
from driver.fabricclient.systems import system_nodes as system_nodes

log = logging.getLogger(__name__)
ROOT = "/redfish/v1"
NVME_OF = "NVMeOverFabrics"
ORDER = {"Attached": 0, "Attaching": 1, "Detaching": 2, "Failed": 3}  # which binding is first


_key = key


def children(uris: Mapping[str, str], collection: str) -> dict[str, str]:
    """The entries of ``uris`` that are members of ``collection`` (by URI)."""
    prefix = collection.rstrip("/") + "/"
    return {u: w for u, w in uris.items() if u.startswith(prefix) and "/" not in u[len(prefix) :]}


def system_of(uri: str) -> str:
    """``/redfish/v1/Systems/<id>`` of a URI under a system, or ""."""
    sid = wire.segment_after(uri, "Systems")
    return f"{ROOT}/Systems/{sid}" if sid else ""


class InventoryReader:
    def __init__(self, dialect: Dialect, systems: Mapping[str, str]) -> None:
        self.dialect = dialect
        self._systems = {k.lower(): v for k, v in systems.items()}
        # System UUID -> node, learned from the Nodes' systemUUID (the controller's
        # set_node_uuids): the last resort, after the mapping and HostName.
        self.node_uuids: dict[str, str] = {}

    async def read(self, links: Links, fabrics_uri: str) -> FabricInventory:
        fabrics = self._parsed(links, wire.Fabric, await links.members(fabrics_uri, tolerant=True))
        parts = await asyncio.gather(*(self._fabric(links, f) for f in fabrics))
        return FabricInventory(
            tuple(d for p in parts for d in p.devices),
            tuple(a for p in parts for a in p.adapters),
            tuple(e for p in parts for e in p.nqn_endpoints),
            tuple(v for p in parts for v in p.volumes),
            tuple(links.broken.items()),
            tuple(h for p in parts for h in p.held_back),
        )

    @staticmethod
    def _parsed(links: Links, model: type[wire.M], bodies: list[dict[str, Any]]) -> list[wire.M]:
        out = []
        for body in bodies:
            uri = str(body.get("@odata.id", "?"))
            try:
                out.append(parse(model, body, uri))
            except FabricMalformed as exc:
                links.note_broken(uri, exc)
        return out

    async def _endpoints(
        self, links: Links, fab: wire.Fabric, bindings: list[Binding]
    ) -> tuple[list[wire.Endpoint], Graph]:
        """The fabric's endpoints (its collection's, and those bindings and switch ports
        name beyond it) and its graph of switches."""
        where = fab.endpoints.odata_id if fab.endpoints else ""
        members = await links.members(where, tolerant=True) if where else []
        eps = self._parsed(links, wire.Endpoint, members)
        graph = await read_graph(links, fab, eps)
        known = {_key(e.odata_id) for e in eps}
        named = dict.fromkeys(u for b in bindings for u in (*b.initiators, *b.targets))
        named |= dict.fromkeys(sorted(graph.endpoints()))
        for uri in (u for u in named if u not in known and u not in links.broken):
            ep = await links.maybe(wire.Endpoint, uri, bindings_naming(bindings, uri))
            if ep is not None:
                log.info("fabric endpoint %s: not in %s, named by a binding or port", uri, where)
                eps.append(ep)
        return eps, graph

    async def _fabric(self, links: Links, fab: wire.Fabric) -> FabricInventory:
        fab = await resolved(links, fab)
        bindings = await self.dialect.bindings(links, fab)
        eps, graph = await self._endpoints(links, fab, bindings)
        more = await self.dialect.named(links, eps, {b.uri for b in bindings})
        if more:  # bindings the collection omits name endpoints it may omit too
            bindings += more
            eps, graph = await self._endpoints(links, fab, bindings)
        switches = {_key(e.odata_id): graph.switch(e) for e in eps}
        nqn = tuple(NqnEndpoint(e.id, fab.id, e.role(), wire.durable(e.identifiers, "NQN"))
                    for e in eps if e.protocol == NVME_OF)  # fmt: skip
        ini_eps = [e for e in eps if e.role() in ("Initiator", "Both") and e.protocol != NVME_OF]
        adapters = list(
            await asyncio.gather(*(self._adapter(links, fab.id, e, switches) for e in ini_eps))
        )
        rooms = await read_rooms(links, graph)  # each adapter's room (its VCS's vPPBs)
        adapters = [
            dataclasses.replace(a, room=room, vcs=vcs)
            for e, a in zip(ini_eps, adapters, strict=True)
            for room, vcs in (rooms.get(_key(e.odata_id), (0, "")),)
        ]
        by_uri = {_key(e.odata_id): a for e, a in zip(ini_eps, adapters, strict=True)}
        targets = [e for e in eps if e.role() in ("Target", "Both") and e.protocol != NVME_OF]
        found = await asyncio.gather(*(self._identify(links, e) for e in targets))
        held = dict(self._in_doubt(links, fab, eps, targets))
        bound = self._bound(bindings, by_uri)
        devices = []
        for e, i in zip(targets, found, strict=True):
            if isinstance(i, str):
                held.setdefault(e.id, i)
            elif i is not None and e.id not in held:
                sw = switches.get(_key(e.odata_id), "")
                reach = tuple(a for a in adapters if graph.joins(a.switch, sw))
                devices.append(_device(fab.id, e, i, sw, reach, bound.get(_key(e.odata_id), [])))
        volumes = await self._volumes(links, fab)
        return FabricInventory(tuple(devices), tuple(adapters), nqn, volumes, (),
                               tuple(held.items()))  # fmt: skip

    @staticmethod
    async def _identify(links: Links, e: wire.Endpoint) -> Identity | str | None:
        """Its identity; None: no device of ours; a string: why it is unreadable."""
        try:
            return await identify(links, e)
        except (FabricApiError, FabricResourceBroken) as exc:
            if not links.note_broken(getattr(exc, "uri", "") or e.odata_id, exc):
                raise
            return f"its identity is unreadable: {exc}"

    @staticmethod
    def _in_doubt(
        links: Links, fab: wire.Fabric, eps: list[wire.Endpoint], targets: list[wire.Endpoint]
    ) -> list[tuple[str, str]]:
        """(device id, why) of devices held back: a broken endpoint of the collection,
        or a target a broken binding may name."""
        out = []
        if fab.endpoints is not None:
            for uri, why in children(links.broken, fab.endpoints.odata_id).items():
                out.append((wire.last_segment(uri), f"its endpoint {uri} is unreadable: {why}"))
        bad: dict[str, str] = {}
        for coll in (fab.connections, fab.zones):
            if coll is not None:
                bad |= children(links.broken, coll.odata_id)
        backlinks = any(e.links.connections or e.links.zones for e in eps)
        for e in targets if bad else []:
            named = [_key(x.odata_id) for x in (*e.links.connections, *e.links.zones)]
            doubt = [u for u in named if u in bad] or ([] if backlinks else list(bad))
            if doubt:
                out.append((e.id, f"binding {doubt[0]}, which may name it, is unreadable"))
        return out

    @staticmethod
    def _bound(
        bindings: list[Binding], initiators: Mapping[str, HostAdapter]
    ) -> dict[str, list[FabricConnection]]:
        """Target endpoint URI -> its bindings, one per initiator, attached first."""
        out: dict[str, list[FabricConnection]] = {}
        for b in bindings:
            for t in b.targets:
                for ini_uri in b.initiators or ("",):
                    ini = initiators.get(ini_uri)
                    out.setdefault(t, []).append(FabricConnection(
                        b.id, b.uri, wire.last_segment(t), ini.node if ini else "",
                        ini.adapter if ini else "", b.state, "", None, ini_uri,
                    ))  # fmt: skip
        for conns in out.values():
            conns.sort(key=lambda c: ORDER[c.state])
        return out

    async def _adapter(
        self, links: Links, fabric: str, e: wire.Endpoint, switches: Mapping[str, str]
    ) -> HostAdapter:
        refs = [x.link.odata_id for x in e.entities if x.role in ("Initiator", "Both") and x.link]
        refs += [p.odata_id for p in e.links.ports]
        system_uri = next(filter(None, (system_of(r) for r in refs)), "")
        system = wire.System()
        if system_uri:
            system = await links.maybe(wire.System, system_uri, e.odata_id) or system
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
        grants: dict[str, tuple[str, ...]] = {}  # volume URI -> initiator endpoint ids
        for c in await connections_in(links, fab.connections.odata_id):
            b = await binding(links, c) if c.volumes else None
            inis = tuple(wire.last_segment(i) for i in b.initiators) if b else ()
            for info in c.volumes:
                if info.volume is not None:
                    had = grants.get(info.volume.odata_id, ())
                    grants[info.volume.odata_id] = had + tuple(i for i in inis if i not in had)
        out = []
        for uri, inis in grants.items():
            v = await links.maybe(wire.Volume, uri, fab.connections.odata_id)
            if v is not None:
                nguid = wire.durable(v.identifiers, "NGUID")
                out.append(FabricVolume(v.odata_id, v.capacity_bytes, nguid, inis))
        return tuple(out)


COLLECTIONS = {"endpoints": "Endpoints", "connections": "Connections", "zones": "Zones",
               "switches": "Switches"}  # fmt: skip


async def resolved(links: Links, fab: wire.Fabric) -> wire.Fabric:
    """``fab`` with each collection link that answers (``Links.collection``): a
    broken one is recorded and the collection's standard URI read instead."""
    if not fab.odata_id:
        return fab
    update = {}
    for attr, name in COLLECTIONS.items():
        linked: wire.Link | None = getattr(fab, attr)
        uri = await links.collection(fab.odata_id, name, linked.odata_id if linked else "")
        update[attr] = wire.Link.model_validate({"@odata.id": uri}) if uri else None
    return fab.model_copy(update=update)


def bindings_naming(bindings: list[Binding], uri: str) -> str:
    """The URI of a binding that names endpoint ``uri`` (where a link to it is)."""
    return next((b.uri for b in bindings if uri in (*b.initiators, *b.targets)), "")


def _device(
    fabric: str, e: wire.Endpoint, i: Identity, switch: str, reach: tuple[HostAdapter, ...],
    conns: list[FabricConnection],
) -> FabricDevice:  # fmt: skip
    return FabricDevice(
        e.id, fabric, switch, i.kind, i.model, i.serial, i.uuid, i.vendor_id, i.device_id,
        e.status.health or "OK", e.status.state != "UnavailableOffline",
        any(c.state == "Attached" for c in conns),
        reach, conns[0] if conns else None, i.mac, i.capacity_bytes, i.nqn, e.odata_id,
        tuple(conns), i.logical_device,
    )  # fmt: skip
