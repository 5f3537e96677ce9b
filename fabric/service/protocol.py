"""DSP0266 protocol rules every answer follows (a middleware), checked by DMTF's
protocol validator (tests/integration/test_redfish_conformance.py).

Why one place: these rules concern the HTTP exchange, not any resource:
- a request asking for an ``OData-Version`` other than 4.0 is refused (412);
- an unknown query parameter starting with ``$`` is 501 (only ``$expand``
  is offered, and advertised in ``ProtocolFeaturesSupported``);
- every answer says ``Cache-Control`` (nothing here may be cached: the
  fabric changes under the client), and a GET/HEAD answer the methods the
  URI allows (``Allow``), derived from the routes so it cannot drift.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from fabric.service.auth import Handler
from fabric.service.errors import RedfishError

SUPPORTED_QUERY = frozenset({"$expand"})


def _allowed(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    if resource is None:
        return None
    methods = {route.method for route in resource} - {"*"}
    return ", ".join(sorted(methods)) if methods else None


def protocol_middleware() -> Middleware:
    @web.middleware
    async def protocol(request: web.Request, handler: Handler) -> web.StreamResponse:
        version = request.headers.get("OData-Version")
        if version is not None and version.strip() != "4.0":
            raise RedfishError(
                412, "PreconditionFailed", f"OData-Version {version}: only 4.0 is served"
            )
        unknown = sorted(k for k in request.query if k.startswith("$") and k not in SUPPORTED_QUERY)
        if unknown:
            raise RedfishError(
                501, "QueryNotSupported", f"query parameter {unknown[0]} is not supported"
            )
        resp = await handler(request)
        if not resp.prepared:  # an event stream has already sent its headers
            resp.headers.setdefault("Cache-Control", "no-cache")
            if request.method in ("GET", "HEAD") and (allow := _allowed(request)):
                resp.headers.setdefault("Allow", allow)
        return resp

    return protocol
