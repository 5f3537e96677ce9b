"""The ``connections`` dialect: DMTF ``Fabric/Connections`` (POST to attach, DELETE to detach).

Why a module: this is DMTF's own way (the CXL and NVMe-oF mockups use it)
and our default. An attach POSTs a Connection naming the initiator and
target endpoints, with the ``@odata.type`` the service shows
(:mod:`odata_types`); CXL memory is a ``ConnectionType: Memory`` connection
whose ``MemoryChunkInfo`` names the logical device's memory chunks (from
the endpoint's ``MemoryChunk`` entities, else the CXLLogicalDevice's
``Links.MemoryChunks``).

A Connection may bind several initiators and targets, named directly
(``InitiatorEndpoints``, ``TargetEndpoints``) or through endpoint groups
(``...EndpointGroups``, resolved to their members): all are read
(:func:`binding`). A detach removes every Connection of the device to its
node: one binding only the device and that node: DELETE; one with other
targets: PATCHed without the device; one with other hosts' initiators:
PATCHed without this node's; one that binds it through an endpoint group,
or binds other devices to other hosts as well, is refused with
:class:`FabricConflict` naming it (no single request removes only this
device from this node).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from driver.errors import FabricConflict, FabricMalformed, FabricNotFound, FabricResourceBroken
from driver.fabricclient import wire
from driver.fabricclient.attachment import IDEMPOTENCY_HEADER, Binding, key, link, state_of
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import AttachResult, FabricDevice, FabricTask, HostAdapter
from driver.fabricclient.odata_types import odata_type
from driver.fabricclient.operations import Operations

log = logging.getLogger(__name__)


async def binding(links: Links, c: wire.Connection) -> Binding | None:
    """Connection ``c`` with its endpoint groups resolved; None when a group of it
    cannot be read (the connection is then recorded broken)."""
    ends: list[list[str]] = [[key(x.odata_id) for x in c.links.initiators],
                             [key(x.odata_id) for x in c.links.targets]]  # fmt: skip
    for out, groups in zip(ends, (c.links.initiator_groups, c.links.target_groups), strict=True):
        for g in groups:
            group = await links.maybe(wire.EndpointGroup, g.odata_id, c.odata_id)
            if group is None:
                links.note_broken(c.odata_id, FabricResourceBroken(
                    f"fabric connection {c.odata_id}: its endpoint group {g.odata_id} is "
                    "unreadable", c.odata_id))  # fmt: skip
                return None
            out.extend(key(e.odata_id) for e in group.members() if key(e.odata_id) not in out)
    grouped = bool(c.links.initiator_groups or c.links.target_groups)
    return Binding(c.id, c.odata_id, tuple(ends[0]), tuple(ends[1]), state_of(c.status), grouped)


async def connections_in(links: Links, where: str) -> list[wire.Connection]:
    """The Connections of collection ``where`` that can be read (the others
    recorded broken)."""
    out = []
    for body in await links.members(where, tolerant=True):
        uri = str(body.get("@odata.id", where))
        try:
            out.append(parse(wire.Connection, body, uri))
        except FabricMalformed as exc:
            links.note_broken(uri, exc)
    return out


async def memory_chunks(links: Links, dev: FabricDevice) -> list[str]:
    ep = await links.model(wire.Endpoint, dev.endpoint_uri())
    chunks = [e.link.odata_id for e in ep.entities if e.type == "MemoryChunk" and e.link]
    for e in ep.entities:
        if not chunks and e.type == "CXLDevice" and e.link is not None:
            ld = await links.model(wire.Device, e.link.odata_id)
            chunks = [c.odata_id for c in ld.links.memory_chunks]
    return chunks


class ConnectionsDialect:
    name = "connections"
    picks_devices = False  # it attaches the device it is asked for

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        return None  # a system names its node (HostName, a mapping or a systemUUID)

    async def bindings(self, links: Links, fabric: wire.Fabric) -> list[Binding]:
        if fabric.connections is None:
            return []
        found = [await binding(links, c)
                 for c in await connections_in(links, fabric.connections.odata_id)]  # fmt: skip
        return [b for b in found if b is not None and b.targets]  # Storage: volumes instead

    async def named(self, links: Links, eps: list[wire.Endpoint], known: set[str]) -> list[Binding]:
        out = []
        for uri in dict.fromkeys(key(c.odata_id) for e in eps for c in e.links.connections):
            if uri in known or uri in links.broken:
                continue
            c = await links.maybe(
                wire.Connection, uri, "an endpoint's Links.Connections", gone_ok=True
            )
            found = await binding(links, c) if c is not None else None
            if found is not None and found.targets:
                log.info("fabric connection %s: not in its collection, named by an endpoint", uri)
                out.append(found)
        return out

    async def attach(
        self, ops: Operations, links: Links, dev: FabricDevice, via: HostAdapter, key: str
    ) -> AttachResult:
        uri = f"/redfish/v1/Fabrics/{dev.fabric}/Connections"
        try:  # the types the service shows; Sunfish creates the collection on first POST
            seen = [c.odata_type for c in await connections_in(links, uri)]
        except FabricNotFound:
            seen = []
        body: dict[str, Any] = {
            "@odata.type": await odata_type(links, "Connection", seen),
            "Links": {
                "InitiatorEndpoints": [link(via.endpoint_uri())],
                "TargetEndpoints": [link(dev.endpoint_uri())],
            },
        }
        if dev.kind == "cxlmem":
            chunks = await memory_chunks(links, dev)
            body["ConnectionType"] = "Memory"
            body["MemoryChunkInfo"] = [
                {"AccessCapabilities": ["Read", "Write"], "MemoryChunk": link(c)} for c in chunks
            ]
        _, task = await ops.submit("POST", uri, body, {IDEMPOTENCY_HEADER: key}, "attach", dev.id)
        if task.done:
            log.info("fabric attach %s -> %s/%s: done", dev.id, via.node, via.adapter)
            return AttachResult(task.connection_uri, None)
        # The connection the target endpoint links now (Links.Connections), read afresh.
        ep = await Links(links.transport).model(wire.Endpoint, dev.endpoint_uri())
        conn = ep.links.connections[0].odata_id if ep.links.connections else ""
        log.info("fabric attach %s -> %s/%s: task %s", dev.id, via.node, via.adapter, task.uri)
        return AttachResult(conn, task)

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        assert dev.connection is not None
        node = dev.connection.node
        mine = dev.bound_to(node)
        ours = {c.initiator for c in mine if c.initiator}
        tasks = []
        for uri in dict.fromkeys(c.uri for c in mine):
            found = await binding(links, await links.model(wire.Connection, uri))
            if found is None:
                raise FabricResourceBroken(f"fabric connection {uri} of {dev.id}: unreadable "
                                           f"({links.broken.get(uri, '?')})", uri)  # fmt: skip
            tasks.append(await self._unbind(ops, found, dev, ours))
            log.info("fabric detach %s from %s: %s", dev.id, node, tasks[-1].uri)
        return ops.combine(tasks, "detach", dev.id)

    async def _unbind(
        self, ops: Operations, b: Binding, dev: FabricDevice, ours: set[str]
    ) -> FabricTask:
        target = key(dev.endpoint_uri())
        other_targets = [t for t in b.targets if t != target]
        other_inis = [i for i in b.initiators if i not in ours]
        if not other_targets and not other_inis:
            _, task = await ops.submit("DELETE", b.uri, None, {}, "detach", dev.id)
            return task
        if b.grouped or (other_targets and other_inis):
            how = "through an endpoint group" if b.grouped else "with others to other hosts"
            raise FabricConflict(409, "DetachNotAlone", f"connection {b.uri} binds {dev.id} "
                                 f"{how}: no one request removes only it from this node; "
                                 "change the connection by hand", "DELETE", b.uri)  # fmt: skip
        links_body = (
            {"TargetEndpoints": [link(t) for t in other_targets]} if other_targets
            else {"InitiatorEndpoints": [link(i) for i in other_inis]}
        )  # fmt: skip
        _, task = await ops.submit("PATCH", b.uri, {"Links": links_body}, {}, "detach", dev.id)
        return task
