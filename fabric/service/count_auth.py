"""The count face's authentication: an OAuth2 token endpoint and bearer access tokens.

Why a module: managers of the count kind sit behind an identity manager
(Keycloak-style ``/id_manager/realms/<realm>/protocol/openid-connect/token``)
and take ``Authorization: Bearer <access token>`` on every call. The
simulator issues access tokens for the OAuth2 client-credentials grant
(RFC 6749 section 4.4: ``grant_type=client_credentials``, ``client_id``
:data:`CLIENT_ID`, ``client_secret`` the service's token, in the form or
as HTTP Basic), each valid for :data:`TTL_S` seconds. The service's token
itself is also accepted as a bearer token (a manager configured with a
static token). OAuth2 errors are RFC 6749's ``{"error", "error_description"}``.
"""

from __future__ import annotations

import logging
import secrets
import time

from aiohttp import web

from driver.fabricclient.token import TokenSource
from fabric.service.auth import basic_password, same_secret
from fabric.service.count_wire import FmError

log = logging.getLogger(__name__)
CLIENT_ID = "patchbay"
TTL_S = 300.0
GRANT = "client_credentials"


class Tokens:
    """Issued access tokens and their expiry (monotonic seconds)."""

    def __init__(self, secret: TokenSource, ttl_s: float = TTL_S) -> None:
        self._secret, self._ttl = secret, ttl_s
        self._issued: dict[str, float] = {}

    def issue(self) -> tuple[str, float]:
        now = time.monotonic()
        self._issued = {t: exp for t, exp in self._issued.items() if exp > now}
        token = secrets.token_urlsafe(24)
        self._issued[token] = now + self._ttl
        return token, self._ttl

    def valid(self, token: str) -> bool:
        exp = self._issued.get(token)
        return (exp is not None and exp > time.monotonic()) or same_secret(
            token, self._secret.current()
        )

    def client_ok(self, client_id: str, client_secret: str) -> bool:
        return same_secret(client_id, CLIENT_ID) and same_secret(
            client_secret, self._secret.current()
        )


TOKENS = web.AppKey("count_tokens", Tokens)


def oauth_error(status: int, error: str, text: str) -> web.Response:
    return web.json_response({"error": error, "error_description": text}, status=status)


async def token(request: web.Request) -> web.Response:
    """``POST`` the token endpoint: an access token for valid client credentials."""
    form = await request.post()
    grant = str(form.get("grant_type", ""))
    if grant != GRANT:
        return oauth_error(
            400, "unsupported_grant_type", f"grant_type: {grant!r}; only {GRANT!r} is served"
        )
    basic = basic_password(request.headers.get("Authorization", ""))
    client_id, secret = basic or (
        str(form.get("client_id", "")),
        str(form.get("client_secret", "")),
    )
    tokens = request.app[TOKENS]
    if not tokens.client_ok(client_id, secret):
        log.info("count token: client %r refused", client_id)
        return oauth_error(401, "invalid_client", f"client_id {client_id!r}: credentials refused")
    access, ttl = tokens.issue()
    body = {"access_token": access, "token_type": "Bearer", "expires_in": int(ttl)}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


def require_bearer(request: web.Request) -> None:
    """Raise a 401 unless the request carries an access token this face accepts."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() != "bearer ":
        raise FmError(401, "E40100", "Authorization: a Bearer access token is required")
    if not request.app[TOKENS].valid(header[7:].strip()):
        raise FmError(401, "E40101", "Authorization: access token unknown or expired")
