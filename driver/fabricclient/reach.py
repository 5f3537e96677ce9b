"""Which switch each endpoint hangs on, and which switches reach each other.

Why a module: a device is reachable from a host adapter when a path of
switch ports and inter-switch links joins them, and a fabric of more than
one switch (DMTF's multi-switch CXL fabric, Sunfish's two switches: hosts
on one, memory on the other) is the common case. This module reads the
fabric's graph once per inventory read:

- every switch's ports (tolerant: a broken one is recorded and skipped),
  their ``AssociatedEndpoints`` and ``ConnectedPorts``; a port another
  port or an endpoint names that its switch's collection omits is read by
  its URI;
- an endpoint's switch: the switch of a port in its ``Links.ConnectedPorts``,
  else the switch whose port lists it (``AssociatedEndpoints``) or is
  connected to the endpoint's own port (``Links.LocalPorts``/``Ports``);
- two switches are joined when a port of one names a port of the other
  (``ConnectedPorts`` or ``ConnectedSwitchPorts``, either side) or the other
  switch (``ConnectedSwitches``): an island of joined switches is one reach.
  The walk keeps what it has seen, so links that loop (both sides of one
  link, a port naming itself, rings of switches) end it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from driver.errors import FabricMalformed
from driver.fabricclient import wire
from driver.fabricclient.attachment import key
from driver.fabricclient.links import Links, parse

log = logging.getLogger(__name__)


def switch_of(uri: str) -> str:
    """The switch Id in a switch port's URI (``.../Switches/<sw>/Ports/<p>``), or ""."""
    sw = wire.segment_after(uri, "Switches")
    return sw if sw and "/Ports/" in uri else ""


@dataclass
class Graph:
    port_switch: dict[str, str] = field(default_factory=dict)  # port URI -> switch Id
    ends: dict[str, list[str]] = field(default_factory=dict)  # port URI -> endpoint URIs
    peers: dict[str, list[str]] = field(default_factory=dict)  # port URI -> port URIs
    linked: set[tuple[str, str]] = field(default_factory=set)  # switches a port names
    vcss: list[str] = field(default_factory=list)  # switches' VirtualCXLSwitches collections
    _islands: dict[str, int] | None = None  # computed once the graph is read

    def endpoints(self) -> set[str]:
        """Every endpoint a port names."""
        return {e for es in self.ends.values() for e in es}

    def switch(self, ep: wire.Endpoint) -> str:
        """The switch endpoint ``ep`` hangs on, or ""."""
        for p in ep.links.connected_ports:
            sw = self.port_switch.get(key(p.odata_id)) or switch_of(p.odata_id)
            if sw:
                return sw
        me, own = key(ep.odata_id), {key(p.odata_id) for p in ep.links.ports}
        for port, sw in self.port_switch.items():
            if me in self.ends.get(port, ()) or own & set(self.peers.get(port, ())):
                return sw
        return ""

    def joins(self, a: str, b: str) -> bool:
        """Whether switches ``a`` and ``b`` (both known) are one reach."""
        if not a or not b:
            return False
        if self._islands is None:
            self._islands = self.islands()
        islands = self._islands
        return a == b or (a in islands and islands.get(a) == islands.get(b))

    def islands(self) -> dict[str, int]:
        """Switch Id -> the number of its island (switches joined by links)."""
        joined: dict[str, set[str]] = {sw: set() for sw in self.port_switch.values()}
        for a, b in self.linked:
            joined.setdefault(a, set()).add(b)
            joined.setdefault(b, set()).add(a)
        for port, peers in self.peers.items():
            mine = self.port_switch[port]
            for other in (self.port_switch.get(p) for p in peers):
                if other is not None and other != mine:
                    joined[mine].add(other)
                    joined[other].add(mine)
        island: dict[str, int] = {}
        for n, start in enumerate(sorted(joined)):
            todo = [start] if start not in island else []
            while todo:
                sw = todo.pop()
                if sw not in island:
                    island[sw] = n
                    todo.extend(joined[sw] - island.keys())
        return island


async def read_graph(links: Links, fab: wire.Fabric, eps: list[wire.Endpoint]) -> Graph:
    """The switches and ports of ``fab`` (see the module docstring)."""
    g = Graph()
    if fab.switches is None:
        return g
    todo: list[str] = []
    for body in await links.members(fab.switches.odata_id, tolerant=True):
        sw = _parsed(links, wire.Switch, body)
        if sw is not None and sw.cxl is not None and sw.cxl.virtual_cxl_switches is not None:
            g.vcss.append(sw.cxl.virtual_cxl_switches.odata_id)  # adapter room (room.py)
        linked = sw.ports.odata_id if sw is not None and sw.ports is not None else ""
        ports = await links.collection(sw.odata_id, "Ports", linked) if sw else ""
        if sw is not None and ports:
            for p in await links.members(ports, tolerant=True):
                port = _parsed(links, wire.Port, p)
                if port is not None:
                    todo += _add(g, sw.id, port)
    todo += [p.odata_id for e in eps for p in e.links.connected_ports]
    seen = set(g.port_switch)
    while todo:
        uri = key(todo.pop())
        owner = switch_of(uri)
        if uri in seen or not owner:
            continue
        seen.add(uri)
        named = await links.maybe(wire.Port, uri, "a link of the fabric's graph")
        if named is not None:
            log.info("fabric switch port %s: not in its collection, named by a link", uri)
            todo += _add(g, owner, named)
    return g


def _add(g: Graph, switch: str, port: wire.Port) -> list[str]:
    """Record ``port`` of ``switch``; the ports it names."""
    uri = key(port.odata_id)
    g.port_switch[uri] = switch
    g.ends[uri] = [key(x.odata_id) for x in port.links.associated_endpoints]
    ends = (*port.links.connected_ports, *port.links.connected_switch_ports)
    g.peers[uri] = [key(x.odata_id) for x in ends]
    g.linked |= {(switch, wire.last_segment(x.odata_id)) for x in port.links.connected_switches}
    return g.peers[uri]


def _parsed(links: Links, model: type[wire.M], body: dict[str, object]) -> wire.M | None:
    uri = str(body.get("@odata.id", "?"))
    try:
        return parse(model, body, uri)
    except FabricMalformed as exc:
        links.note_broken(uri, exc)
        return None
