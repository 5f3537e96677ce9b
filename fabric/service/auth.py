"""Authentication and Redfish-shaped error rendering (middlewares).

Every path needs credentials except what DSP0266 leaves open (the version
object ``/redfish``, the service root, ``$metadata``, the OData service
document), the login itself (``POST .../Sessions``) and ``/healthz``.
Accepted, each compared in constant time with the current token (a token
file is re-read when it changes: rotation without a restart):
``Authorization: Bearer <token>`` (or an OAuth2 access token the count face
issued, ``count_auth.py``); HTTP Basic as :data:`sessions.USER` with
the token as password; ``X-Auth-Token`` with a Redfish session's token
(``sessions.py``; never the service token itself, which is a password, not a
session). Any refused request - ours or
aiohttp's own 404/405 - is answered with a Redfish error body.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from driver.fabricclient.token import TokenSource
from fabric.service import sessions, uris
from fabric.service.count_wire import ISSUED, OWN_AUTH
from fabric.service.errors import RedfishError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC = frozenset(
    {
        "/redfish",
        "/redfish/",
        uris.ROOT,
        f"{uris.ROOT}/",
        f"{uris.ROOT}/$metadata",
        f"{uris.ROOT}/odata",
        "/healthz",
    }
)


def same_secret(got: str, want: str) -> bool:
    return hmac.compare_digest(got.encode(), want.encode())


def basic_password(header: str) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic`` header, None if it is not one."""
    if header[:6].lower() != "basic ":
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def authenticate(request: web.Request, token: str, live: sessions.Sessions) -> None:
    """Raise 401 unless the request carries a credential the service accepts."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        got, issued = header[7:].strip(), request.app.get(ISSUED)
        if not (same_secret(got, token) or (issued is not None and issued(got))):
            raise RedfishError(401, "InsufficientPrivilege", "bearer token not accepted")
        return
    basic = basic_password(header)
    if basic is not None:
        if not (same_secret(basic[0], sessions.USER) and same_secret(basic[1], token)):
            raise RedfishError(401, "InsufficientPrivilege", "user name or password not accepted")
        return
    x_auth = request.headers.get("X-Auth-Token")
    if x_auth is not None:
        if live.check(x_auth) is None:
            raise RedfishError(401, "NoValidSession", "X-Auth-Token: no such session")
        return
    raise RedfishError(401, "NoValidSession", "no credentials presented")


def auth_middleware(token: str | TokenSource, live: sessions.Sessions) -> Middleware:
    source = TokenSource(token) if isinstance(token, str) else token

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path.rstrip("/").removesuffix("/Members")
        login = request.method == "POST" and path == uris.SESSIONS
        own = request.path.startswith(OWN_AUTH)  # the count face checks its own tokens
        if request.path not in PUBLIC and not login and not own:
            authenticate(request, source.current(), live)
        return await handler(request)

    return check


def error_response(err: RedfishError) -> web.Response:
    headers = {"OData-Version": "4.0"}
    if err.status == 401:
        headers["WWW-Authenticate"] = 'Basic realm="patchbay-fabric"'
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
    except web.HTTPMethodNotAllowed as exc:
        resp = error_response(
            RedfishError(405, "GeneralError", f"{request.method} not allowed on {request.path}")
        )
        resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return resp
