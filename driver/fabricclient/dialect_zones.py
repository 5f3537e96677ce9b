"""The ``zones`` dialect: attach by adding the target to the host port's Zone.

Why a module: some fabric managers (H3 Platform's, among others) keep one
``ZoneOfEndpoints`` per host port and attach by membership: a target
endpoint listed in the zone's ``Links.Endpoints`` is attached to the zone's
initiator. The initiator endpoint names its zone (``Links.Zones``). Attach
PATCHes the zone with its endpoints plus the target, detach without it;
each PATCH sends ``If-Match`` with the zone's ETag (the ``ETag`` header,
else ``@odata.etag``), so a concurrent change is refused (412) instead of
lost. A 412 is not a failure of the attach: the zone changed between our
read and our PATCH (two devices of one claim attached to one host port at
once do that), so the zone is read again and the PATCH built anew, a few
times (each such PATCH is a new request: its Idempotency-Key gets a suffix,
since a manager that honours the key would replay the 412). Attachments
are read from the zones: every target endpoint in a zone with an initiator
is a connection to that initiator. Membership alone does not say it is
done: a member listed while its attach runs, or after it failed, is
attaching or failed, which the member endpoint's own connection
(``Links.Connections``, the one naming the zone's initiator) says in its
``Status`` (read as the connections dialect reads it:
``attachment.state_of``). A member with no connection linked is
attached: membership is all such a manager tells. Zone members the
Endpoints collection omits are read from the zone's links.

A device in another host's zone is not moved: its attach is refused with
:class:`FabricAttachConflict` naming that zone (the caller detaches it
there first, as for a Connection elsewhere), since adding it to a second
host's zone would hand one device to two hosts. A detach removes the device
from every zone of its node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from driver.errors import FabricApiError, FabricAttachConflict, FabricMalformed, FabricNotFound
from driver.fabricclient import wire
from driver.fabricclient.attachment import IDEMPOTENCY_HEADER, Binding, key, link, state_of
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import (
    AttachResult,
    ConnectionState,
    FabricDevice,
    FabricTask,
    HostAdapter,
)
from driver.fabricclient.operations import Operations

log = logging.getLogger(__name__)
PRECONDITION_TRIES = 5  # PATCHes of one change refused with 412 before we give up


async def member_state(links: Links, member: str, initiator: str, zone: str) -> ConnectionState:
    """How far the attach of zone member ``member`` to ``initiator`` is: its
    connection's ``Status``; Attached when the endpoint links none to it."""
    ep = await links.model(wire.Endpoint, member, zone)
    for ref in ep.links.connections:
        conn = await links.model(wire.Connection, ref.odata_id, member)
        named = [i.odata_id.rstrip("/") for i in conn.links.initiators]
        if not named or initiator in named:
            return state_of(conn.status)
    return "Attached"


class ZonesDialect:
    name = "zones"
    picks_devices = False  # it attaches the device it is asked for

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        return None  # a system names its node (HostName, a mapping or a systemUUID)

    async def bindings(self, links: Links, fabric: wire.Fabric) -> list[Binding]:
        if fabric.zones is None:
            return []
        out = []
        for body in await links.members(fabric.zones.odata_id, tolerant=True):
            uri = str(body.get("@odata.id", fabric.zones.odata_id))
            try:
                out += await self._members(links, parse(wire.Zone, body, uri))
            except FabricMalformed as exc:
                links.note_broken(uri, exc)
        return out

    async def named(self, links: Links, eps: list[wire.Endpoint], known: set[str]) -> list[Binding]:
        out = []
        for uri in dict.fromkeys(key(z.odata_id) for e in eps for z in e.links.zones):
            if uri in known or uri in links.broken:
                continue
            zone = await links.maybe(wire.Zone, uri, "an endpoint's Links.Zones", gone_ok=True)
            if zone is not None:
                out += await self._members(links, zone)
        return out

    async def _members(self, links: Links, zone: wire.Zone) -> list[Binding]:
        """A host port's zone: one binding per target member, else none."""
        uri = zone.odata_id
        members = [key(e.odata_id) for e in zone.links.endpoints]
        eps = await asyncio.gather(*(links.maybe(wire.Endpoint, m, uri) for m in members))
        inis = [m for m, e in zip(members, eps, strict=True)
                if e is not None and e.role() in ("Initiator", "Both")]  # fmt: skip
        if len(inis) != 1:
            return []  # no initiator, or a zone shared by several: not a host port's zone
        targets = [m for m, e in zip(members, eps, strict=True) if e and m not in inis]
        states = await asyncio.gather(*(member_state(links, m, inis[0], uri) for m in targets))
        return [Binding(zone.id, uri, (inis[0],), (m,), state)
                for m, state in zip(targets, states, strict=True)]  # fmt: skip

    async def _zone(self, links: Links, uri: str) -> tuple[wire.Zone, str]:
        resp = await links.transport.request("GET", uri)
        zone = parse(wire.Zone, resp.json_object(f"GET {uri}"), uri)
        return zone, resp.headers.get("ETag") or zone.etag or ""

    async def _patch(
        self, ops: Operations, links: Links, zone_uri: str, change: str, dev: FabricDevice,
        operation: str, key: str,
    ) -> FabricTask:  # fmt: skip
        for attempt in range(PRECONDITION_TRIES):
            zone, etag = await self._zone(links, zone_uri)
            target = dev.endpoint_uri()
            members = [e.odata_id for e in zone.links.endpoints if e.odata_id.rstrip("/") != target]
            if change == "add":
                members.append(target)
            headers = {"If-Match": etag} if etag else {}
            if key:
                headers[IDEMPOTENCY_HEADER] = f"{key}-{attempt}" if attempt else key
            body = {"Links": {"Endpoints": [link(m) for m in members]}}
            try:
                _, task = await ops.submit("PATCH", zone_uri, body, headers, operation, dev.id)
                return task
            except FabricApiError as exc:
                if exc.status != 412 or attempt + 1 == PRECONDITION_TRIES:
                    raise
                log.info("zone %s changed under the %s of %s: reading it again (%s)",
                         zone_uri, operation, dev.id, exc.message)  # fmt: skip
        raise AssertionError("unreachable")  # the loop returns or raises

    async def attach(
        self, ops: Operations, links: Links, dev: FabricDevice, via: HostAdapter, key: str
    ) -> AttachResult:
        ini = await links.model(wire.Endpoint, via.endpoint_uri())
        if not ini.links.zones:
            where = via.endpoint_uri()
            raise FabricNotFound(404, "ResourceNotFound", "expected the initiator to name its "
                                 "zone (Links.Zones)", "GET", where)  # fmt: skip
        zone_uri = ini.links.zones[0].odata_id
        for c in dev.connections:
            if (c.node, c.adapter) != (via.node, via.adapter) and c.state != "Failed":
                raise FabricAttachConflict(409, "AttachedElsewhere", (
                    f"{dev.id} is in zone {c.uri} of {c.node or '?'}/{c.adapter}: not added "
                    f"to the zone of {via.node}/{via.adapter} as well (a device is in one "
                    "host port's zone at a time); detach it there first"
                ), "PATCH", zone_uri)  # fmt: skip
        task = await self._patch(ops, links, zone_uri, "add", dev, "attach", key)
        log.info("fabric attach %s -> %s/%s (zone %s): %s", dev.id, via.node, via.adapter,
                 zone_uri, "done" if task.done else task.uri)  # fmt: skip
        return AttachResult(zone_uri, None if task.done else task)

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        assert dev.connection is not None
        node, tasks = dev.connection.node, []
        for zone in dict.fromkeys(c.uri for c in dev.bound_to(node)):
            tasks.append(await self._patch(ops, links, zone, "remove", dev, "detach", ""))
            log.info("fabric detach %s from %s (zone %s): %s", dev.id, node, zone, tasks[-1].uri)
        return ops.combine(tasks, "detach", dev.id)
