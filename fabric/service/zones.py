"""The zones dialect: attach and detach by editing a host port's zone.

Why: some fabric managers (H3 Platform's among them) do not take
``POST .../Connections``; a host sees a device once the device's endpoint is
in the host port's zone. Here each initiator endpoint (one per node and
adapter) has its own zone, ``Zones/<initiator id>`` (``ZoneOfEndpoints``),
whose ``Links.Endpoints`` is the initiator plus every target attached or
attaching to it. ``PATCH`` with one target more attaches it, with one fewer
detaches it, through the same store, rules, tasks and host effects as the
Connections dialect (a zone attach is a Connection too).

Rules: one target added or removed per PATCH (400 otherwise); the zone's
own initiator must stay (400); ``If-Match`` with a stale ETag is 412 (no
``If-Match``: accepted); the answer is ``202`` + ``Location`` (task
monitor) + the Task, or ``200`` + the zone when nothing was to be done.
A member whose connection failed (``outcomes.py``) stays listed, its
connection (the endpoint's ``Links.Connections``) ``UnavailableOffline``
and ``Critical``: a PATCH without it detaches what is left, and a PATCH
that changes nothing but lists it asks for its attach again (the first
such member).
ETag check and change run under one lock, so two PATCHes built on the same
ETag cannot both act. ``Idempotency-Key`` is honoured as on POST Connections.
"""

from __future__ import annotations

from aiohttp import web

from fabric.service import bodies, redfish, uris
from fabric.service.answers import ONCE, ZONE_LOCK, answer, expand, fabric_of
from fabric.service.core import Fabric
from fabric.service.errors import RedfishError, bad_property, not_found
from fabric.service.inventory import Initiator
from fabric.service.store import FAILED, Connection

FIELD = "Links.Endpoints"


async def _conns(fab: Fabric) -> list[Connection]:
    return await fab.call(fab.store.connections)


def _zone_of(request: web.Request) -> tuple[Fabric, Initiator]:
    fab, f = fabric_of(request)
    ini = fab.inv.initiators.get(request.match_info["zone"])
    if ini is None or ini.fabric != f:
        raise not_found(request.path)
    return fab, ini


async def zones(request: web.Request) -> web.Response:
    fab, f = fabric_of(request)
    conns = await _conns(fab)
    members = [redfish.zone(i, conns) for i in fab.inv.initiators.values() if i.fabric == f]
    return answer(redfish.collection(request.path, "Zone", members, expand(request)))


async def zone(request: web.Request) -> web.Response:
    fab, ini = _zone_of(request)
    body = redfish.zone(ini, await _conns(fab))
    return answer(body, headers={"ETag": body["@odata.etag"]})


async def patch_zone(request: web.Request) -> web.Response:
    return await request.app[ONCE].once(request, lambda: _patch(request))


def _targets(fab: Fabric, ini: Initiator, refs: list[bodies.Ref]) -> set[str]:
    """The target ids a PATCH's endpoint list names (the initiator must be among them)."""
    prefix = uris.endpoint_uri(ini.fabric, "")
    named: set[str] = set()
    for i, ref in enumerate(refs):
        ident = ref.odata_id.rstrip("/").removeprefix(prefix)
        ok = ref.odata_id.startswith(prefix) and (
            ident == ini.id or getattr(fab.inv.targets.get(ident), "fabric", None) == ini.fabric
        )
        if not ok:
            raise bad_property(
                f"{FIELD}[{i}]", f"no endpoint of this zone's fabric at {ref.odata_id}",
                "ResourceMissingAtURI",
            )  # fmt: skip
        named.add(ident)
    if ini.id not in named:
        raise bad_property(FIELD, f"the zone's initiator {prefix}{ini.id} must stay in it")
    return named - {ini.id}


async def _patch(request: web.Request) -> web.Response:
    fab, ini = _zone_of(request)
    patch = bodies.parse(bodies.ZonePatch, await request.read())
    wanted = _targets(fab, ini, patch.links.endpoints)
    async with request.app[ZONE_LOCK]:
        conns = await _conns(fab)
        etag = redfish.zone_etag(redfish.zone_members(ini, conns))
        sent = request.headers.get("If-Match")
        if sent is not None and sent not in ("*", etag, etag.removeprefix("W/")):
            raise RedfishError(
                412, "PreconditionFailed", f"If-Match {sent}: the zone is now at ETag {etag}"
            )
        have = {c.device: c for c in conns if c.initiator == ini.id and c.state != "Detaching"}
        added, removed = sorted(wanted - set(have)), sorted(set(have) - wanted)
        if not added and not removed:  # listing a failed member again asks for it again
            added = sorted(d for d in wanted if have[d].state == FAILED)[:1]
        if len(added) + len(removed) > 1:
            raise bad_property(
                FIELD,
                f"one target added or removed per PATCH (adds {added}, removes {removed})",
                "PropertyValueNotInList",
            )
        if added:
            await fab.call(fab.record_attach_request, ini.id, added[0], "zones")
            out = await fab.attach(ini.id, added[0])
            task = out.task
        elif removed:
            conn = next(c for c in conns if c.device == removed[0])
            task = await fab.detach(conn.id, uris.connection_uri(ini.fabric, conn.id))
        else:
            task = None
    if task is None:
        body = redfish.zone(ini, await _conns(fab))
        return answer(body, headers={"ETag": body["@odata.etag"]})
    return answer(redfish.task(task), 202, uris.monitor_uri(task.id))


def add_routes(app: web.Application, fabric: str) -> None:
    """The zone routes under ``fabric`` (the fabric URI pattern)."""
    r = app.router
    r.add_get(f"{fabric}/Zones", zones)
    r.add_get(f"{fabric}/Zones/{{zone}}", zone)
    r.add_patch(f"{fabric}/Zones/{{zone}}", patch_zone)
