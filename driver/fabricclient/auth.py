"""How the client proves who it is to the fabric: bearer, Basic, a Redfish session or OAuth2.

Why a module: real fabric managers differ. Our simulator (and some managers)
take a bearer token; DSP0266 requires every service to offer HTTP Basic and
Redfish sessions (``POST`` the ``Sessions`` collection with ``UserName`` and
``Password``; the answer's ``X-Auth-Token`` header authenticates later
requests and its ``Location`` is the session, deleted to log out). The mode
is the setting ``fabric_auth``; secrets come from files re-read when they
change (a rotated Secret), as the token does (:class:`TokenSource`).

Count-based managers (the ``count`` dialect) take OAuth2 access tokens from
an identity manager: the client-credentials grant, the token cached until
shortly before it expires and fetched again after a 401.

A login POST carries ``@odata.type`` at the newest ``Session`` version the
service's ``$metadata`` includes (read without credentials, as DSP0266
allows), else ``v1_0_0``. A session is opened on first use, opened again when the fabric answers 401
(it expired or the manager restarted: the request is sent once more), and
deleted on :meth:`Auth.close`. Requests refused together (a listing's many
concurrent reads meeting one expired session) share one new login: only
the request that sent the current token drops it, the others wait on the
lock and use the new one. A login answered 401 or 403 is said to be the
credentials refused, not a protocol fault.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, Self

import aiohttp
from pydantic import BaseModel, Field, ValidationError, model_validator

from driver.errors import FabricApiError, FabricMalformed, FabricResourceBroken, FabricUnavailable
from driver.fabricclient.odata_types import FALLBACK, METADATA, fallback, in_metadata
from driver.fabricclient.token import FabricTokenSettings, TokenSource

log = logging.getLogger(__name__)
AuthMode = Literal["bearer", "basic", "session", "oauth2"]
SESSIONS = "/redfish/v1/SessionService/Sessions"  # where DSP0266 puts them
MAX_TOKEN_BYTES = 64 << 10  # a token endpoint's answer read at most (a JWT is a few kB)

# (method, uri, json body, headers) -> (status, response headers, body); no auth added.
Send = Callable[
    [str, str, dict[str, str] | None, dict[str, str]],
    Awaitable[tuple[int, dict[str, str], bytes]],
]


class Auth:
    """Bearer: the token source's current token on every request."""

    def __init__(self, token: TokenSource) -> None:
        self._token = token

    async def headers(self, send: Send) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token.current()}"}

    async def refused(self, send: Send, sent: dict[str, str]) -> bool:
        """The fabric answered 401 to a request sent with headers ``sent``: True when
        a retry may pass (new credentials)."""
        return False

    async def close(self, send: Send) -> None:
        return None


class BasicAuth(Auth):
    def __init__(self, username: str, password: TokenSource) -> None:
        super().__init__(password)
        self._username = username

    async def headers(self, send: Send) -> dict[str, str]:
        pair = f"{self._username}:{self._token.current()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


class SessionAuth(Auth):
    """A Redfish session, opened on first use and again after a 401."""

    def __init__(self, username: str, password: TokenSource, sessions: str = SESSIONS) -> None:
        super().__init__(password)
        self._username, self._sessions = username, sessions
        self._session: tuple[str, str] | None = None  # (X-Auth-Token, session URI)
        self._type = ""  # the Session @odata.type the service advertises, once known
        self._lock = asyncio.Lock()

    async def headers(self, send: Send) -> dict[str, str]:
        async with self._lock:
            if self._session is None:
                self._session = await self._login(send)
            return {"X-Auth-Token": self._session[0]}

    async def _login(self, send: Send) -> tuple[str, str]:
        if not self._type:  # $metadata is readable without credentials (DSP0266)
            found = ""
            try:
                status, _, text = await send("GET", METADATA, None, {})
                if status == 200:
                    found = in_metadata("Session", text.decode(errors="replace"))
            except FabricResourceBroken as exc:  # too large, cut short: the fallback
                log.info("fabric %s unreadable (%s): Session %s", METADATA, exc, FALLBACK)
            self._type = found or fallback("Session")
        body = {"@odata.type": self._type, "UserName": self._username,
                "Password": self._token.current()}  # fmt: skip
        status, headers, _ = await send("POST", self._sessions, body, {})
        token = headers.get("X-Auth-Token", "")
        if status in (401, 403):
            raise FabricApiError(
                status, "CredentialsRefused",
                f"the fabric refused the credentials of user {self._username!r} (login)",
                "POST", self._sessions,
            )  # fmt: skip
        if status >= 300 or not token:
            raise FabricApiError(
                status, "SessionLoginFailed",
                f"login as {self._username!r}: expected 201 with an X-Auth-Token header, got "
                f"{'no X-Auth-Token' if status < 300 else 'an error'}", "POST", self._sessions,
            )  # fmt: skip
        location = headers.get("Location", "")
        log.info("fabric: logged in as %s (session %s)", self._username, location or "?")
        return token, location

    async def refused(self, send: Send, sent: dict[str, str]) -> bool:
        token = sent.get("X-Auth-Token", "")
        async with self._lock:
            if self._session is not None and self._session[0] == token:
                log.info("fabric: session %s refused (expired?)", self._session[1] or "?")
                self._session = None  # a concurrent refusal of it finds it gone already
        return bool(token)

    async def close(self, send: Send) -> None:
        async with self._lock:
            session, self._session = self._session, None
        if session is not None and session[1]:
            try:
                await send("DELETE", session[1], None, {"X-Auth-Token": session[0]})
            except Exception as exc:  # logging out is best effort: the session expires anyway
                log.info("fabric: logout of %s failed: %s", session[1], exc)


class OAuth2Auth(Auth):
    """OAuth2 client credentials (RFC 6749 section 4.4): an access token from the
    token endpoint (``client_id`` and the secret, re-read from its file), reused
    until shortly before ``expires_in`` ends and fetched again after a 401."""

    LEEWAY_S = 30.0

    def __init__(
        self, token_url: str, client_id: str, secret: TokenSource,
        tls: ssl.SSLContext | None = None, timeout_s: float = 10.0,
    ) -> None:  # fmt: skip
        super().__init__(secret)
        self._url, self._client_id, self._tls = token_url, client_id, tls
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._access: tuple[str, float] | None = None  # (token, monotonic expiry)
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    async def headers(self, send: Send) -> dict[str, str]:
        async with self._lock:
            if self._access is None or self._access[1] <= time.monotonic():
                self._access = await self._fetch()
            return {"Authorization": f"Bearer {self._access[0]}"}

    async def _fetch(self) -> tuple[str, float]:
        form = {
            "grant_type": "client_credentials",
            "client_id": self._client_id,
            "client_secret": self._token.current(),
        }
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls else None
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        try:
            # Not redirected: a 307 would carry the client secret to wherever it points.
            async with self._session.post(self._url, data=form, allow_redirects=False) as r:
                status, raw = r.status, await r.content.read(MAX_TOKEN_BYTES)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise FabricUnavailable(f"OAuth2 token endpoint {self._url}: {exc}") from exc
        try:
            body = OAuth2Token.model_validate_json(raw) if status < 300 else None
        except ValidationError as exc:
            raise FabricMalformed(f"OAuth2 token endpoint {self._url}: {exc}") from exc
        if body is None:
            raise FabricApiError(
                status, "OAuth2TokenRefused",
                f"POST {self._url} as client {self._client_id!r}: "
                f"{raw.decode(errors='replace')[:200]}",
            )  # fmt: skip
        log.info("fabric: OAuth2 access token for %s, %ss", self._client_id, body.expires_in)
        ttl = max(0.0, body.expires_in - self.LEEWAY_S) if body.expires_in else 60.0
        return body.access_token, time.monotonic() + ttl

    async def refused(self, send: Send, sent: dict[str, str]) -> bool:
        used = sent.get("Authorization", "")
        async with self._lock:
            if self._access is not None and used == f"Bearer {self._access[0]}":
                self._access = None  # fetched again once, by the next request
        return bool(used)

    async def close(self, send: Send) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class OAuth2Token(BaseModel):
    """A token endpoint's answer (RFC 6749 section 5.1); other fields are ignored."""

    access_token: str = Field(min_length=1)
    token_type: str = Field(pattern="(?i)^bearer$")
    expires_in: float = 0.0


class FabricAuthSettings(FabricTokenSettings):
    """The client's credentials: the bearer token settings plus Basic/session ones."""

    fabric_auth: AuthMode = Field(
        default="bearer",
        description="how the client authenticates to the fabric: bearer (fabric_token), "
        "basic or session (a Redfish session; both with fabric_username and "
        "fabric_password_file), or oauth2 (OAuth2 client credentials at "
        "fabric_oauth_token_url: fabric_username is the client_id, fabric_password_file "
        "holds the client secret)",
    )
    fabric_username: str = Field(
        default="", description="user name for basic/session auth; the client_id for oauth2"
    )
    fabric_password_file: Path | None = Field(
        default=None,
        description="file holding the password for basic/session auth (the client secret "
        "for oauth2), re-read when it changes",
    )
    fabric_oauth_token_url: str = Field(
        default="",
        description="OAuth2 token endpoint (fabric_auth oauth2), e.g. https://fm/id_manager/"
        "realms/<realm>/protocol/openid-connect/token",
    )

    @model_validator(mode="after")
    def _has_token(self) -> Self:  # replaces the bearer-only check of FabricTokenSettings
        if self.fabric_auth == "bearer":
            if not self.fabric_token and self.fabric_token_file is None:
                raise ValueError("set fabric_token or fabric_token_file (fabric_auth bearer)")
        elif self.fabric_auth == "oauth2" and not self.fabric_oauth_token_url:
            raise ValueError("set fabric_oauth_token_url (fabric_auth oauth2)")
        if self.fabric_auth != "bearer" and (
            not self.fabric_username or self.fabric_password_file is None
        ):
            raise ValueError(
                f"set fabric_username and fabric_password_file (fabric_auth {self.fabric_auth})"
            )
        return self

    def fabric_credentials(self, tls: ssl.SSLContext | None = None) -> Auth:
        """``tls``: what verifies an https:// OAuth2 token endpoint."""
        if self.fabric_auth == "bearer":
            return Auth(self.token_source())
        password = TokenSource(path=self.fabric_password_file)
        if self.fabric_auth == "oauth2":
            return OAuth2Auth(self.fabric_oauth_token_url, self.fabric_username, password, tls)
        if self.fabric_auth == "basic":
            return BasicAuth(self.fabric_username, password)
        return SessionAuth(self.fabric_username, password)
