"""Bearer-token authentication and Redfish-shaped error rendering (middlewares).

Every path needs the token except the Redfish service root (which Redfish
clients read before they log in) and ``/healthz``. The token comes as
``Authorization: Bearer <token>`` or Redfish's ``X-Auth-Token`` header and
is compared in constant time with the current one (a token file is
re-read when it changes: rotation without a restart). Any refused request - ours or aiohttp's own
404/405 - is answered with a Redfish error body.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from driver.fabricclient.token import TokenSource
from fabric.service.errors import RedfishError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC = frozenset({"/redfish/v1", "/redfish/v1/", "/healthz"})


def presented_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    return request.headers.get("X-Auth-Token")


def auth_middleware(token: str | TokenSource) -> Middleware:
    source = TokenSource(token) if isinstance(token, str) else token

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC:
            got = presented_token(request)
            if got is None:
                raise RedfishError(401, "NoValidSession", "no bearer token presented")
            if not hmac.compare_digest(got.encode(), source.current().encode()):
                raise RedfishError(401, "InsufficientPrivilege", "bearer token not accepted")
        return await handler(request)

    return check


def error_response(err: RedfishError) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="patchbay-fabric"'} if err.status == 401 else {}
    return web.json_response(err.body(), status=err.status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RedfishError as err:
        if err.status >= 500:
            log.error("%s %s: %s", request.method, request.path, err.text)
        else:
            log.info("%s %s -> %d %s", request.method, request.path, err.status, err.text)
        return error_response(err)
    except web.HTTPNotFound:
        return error_response(RedfishError(404, "ResourceNotFound", f"nothing at {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(
            RedfishError(405, "GeneralError", f"{request.method} not allowed on {request.path}")
        )
