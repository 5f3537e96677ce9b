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
``dialect_connections.state_of``). A member with no connection linked is
attached: membership is all such a manager tells.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from driver.errors import FabricApiError, FabricNotFound
from driver.fabricclient import wire
from driver.fabricclient.dialect import IDEMPOTENCY_HEADER, link
from driver.fabricclient.dialect_connections import state_of
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import (
    AttachResult,
    ConnectionState,
    FabricConnection,
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

    async def connections(
        self, links: Links, fabric: wire.Fabric, initiators: Mapping[str, HostAdapter]
    ) -> list[FabricConnection]:
        if fabric.zones is None:
            return []
        out = []
        for body in await links.members(fabric.zones.odata_id):
            zone = parse(wire.Zone, body, fabric.zones.odata_id)
            members = [e.odata_id.rstrip("/") for e in zone.links.endpoints]
            inis = [m for m in members if m in initiators]
            if len(inis) != 1:
                continue  # no initiator, or a zone shared by several: not a host port's zone
            ini, targets = initiators[inis[0]], [m for m in members if m not in initiators]
            states = await asyncio.gather(
                *(member_state(links, m, inis[0], zone.odata_id) for m in targets)
            )
            for m, state in zip(targets, states, strict=True):
                out.append(FabricConnection(zone.id, zone.odata_id, wire.last_segment(m),
                                            ini.node, ini.adapter, state, "", None))  # fmt: skip
        return out

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
            raise FabricNotFound(404, "ResourceNotFound", f"{where} names no zone (Links.Zones)")
        zone_uri = ini.links.zones[0].odata_id
        task = await self._patch(ops, links, zone_uri, "add", dev, "attach", key)
        log.info("fabric attach %s -> %s/%s (zone %s): %s", dev.id, via.node, via.adapter,
                 zone_uri, "done" if task.done else task.uri)  # fmt: skip
        return AttachResult(zone_uri, None if task.done else task)

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        assert dev.connection is not None
        task = await self._patch(ops, links, dev.connection.uri, "remove", dev, "detach", "")
        log.info("fabric detach %s from %s: %s", dev.id, dev.connection.node, task.uri)
        return task
