"""What every handler of the service shares: its app keys and how it answers.

Why: the routes are split by concept (``app.py`` the fabric resources,
``zones.py`` the zone dialect, ``services.py`` sessions, tasks, events and
the OData documents); this module holds what they all need so none imports
another: the application's shared objects and the Redfish headers of an
answer (``OData-Version``, ``Location``, ``ETag``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from driver.fabricclient.token import TokenSource
from fabric.service.core import Fabric
from fabric.service.errors import not_found
from fabric.service.idempotency import Idempotency
from fabric.service.sessions import Sessions

FABRIC = web.AppKey("fabric", Fabric)
ONCE = web.AppKey("idempotency", Idempotency)
SESSIONS = web.AppKey("sessions", Sessions)
TOKEN = web.AppKey("token", TokenSource)
# uri -> body of what never changes: hardware.tree and accounts.tree
STATIC = web.AppKey("static", dict[str, dict[str, Any]])
ZONE_LOCK = web.AppKey("zone_lock", asyncio.Lock)  # a zone's ETag check and change, atomic

Json = dict[str, Any]
SCHEMAS = "http://redfish.dmtf.org/schemas/v1"


def answer(
    body: Json | None,
    status: int = 200,
    location: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A Redfish answer: JSON body (or none), ``OData-Version``, ``Location`` if given."""
    out = {"OData-Version": "4.0", **(headers or {})}
    if location:
        out["Location"] = location
    schema = str((body or {}).get("@odata.type", "")).lstrip("#").rsplit(".", 1)[0]
    if schema:  # the JSON schema that describes the body (DSP0266: Link rel=describedby)
        out["Link"] = f"<{SCHEMAS}/{schema}.json>; rel=describedby"
    if body is None:
        return web.Response(status=status, headers=out)
    return web.json_response(body, status=status, headers=out)


def expand(request: web.Request) -> bool:
    """``$expand=.`` (or ``*``/``~``): inline a collection's members."""
    return request.query.get("$expand", "").startswith((".", "*", "~"))


def fabric_of(request: web.Request) -> tuple[Fabric, str]:
    """The service's fabric and the fabric id the path names (404 if none)."""
    fab = request.app[FABRIC]
    ident = request.match_info.get("fabric", "")
    if ident not in fab.inv.fabrics:
        raise not_found(request.path)
    return fab, ident
