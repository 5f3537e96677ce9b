"""How the client proves who it is to the fabric: bearer, HTTP Basic or a Redfish session.

Why a module: real fabric managers differ. Our simulator (and some managers)
take a bearer token; DSP0266 requires every service to offer HTTP Basic and
Redfish sessions (``POST`` the ``Sessions`` collection with ``UserName`` and
``Password``; the answer's ``X-Auth-Token`` header authenticates later
requests and its ``Location`` is the session, deleted to log out). The mode
is the setting ``fabric_auth``; secrets come from files re-read when they
change (a rotated Secret), as the token does (:class:`TokenSource`).

A session is opened on first use, opened again when the fabric answers 401
(it expired or the manager restarted: the request is sent once more), and
deleted on :meth:`Auth.close`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from driver.errors import FabricApiError
from driver.fabricclient.token import FabricTokenSettings, TokenSource

log = logging.getLogger(__name__)
AuthMode = Literal["bearer", "basic", "session"]
SESSIONS = "/redfish/v1/SessionService/Sessions"  # where DSP0266 puts them

# (method, uri, json body, headers) -> (status, response headers); no auth added.
Send = Callable[
    [str, str, dict[str, str] | None, dict[str, str]], Awaitable[tuple[int, dict[str, str]]]
]


class Auth:
    """Bearer: the token source's current token on every request."""

    def __init__(self, token: TokenSource) -> None:
        self._token = token

    async def headers(self, send: Send) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token.current()}"}

    async def refused(self, send: Send) -> bool:
        """The fabric answered 401: True when a retry may pass (new credentials)."""
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
        self._lock = asyncio.Lock()

    async def headers(self, send: Send) -> dict[str, str]:
        async with self._lock:
            if self._session is None:
                self._session = await self._login(send)
            return {"X-Auth-Token": self._session[0]}

    async def _login(self, send: Send) -> tuple[str, str]:
        body = {"UserName": self._username, "Password": self._token.current()}
        status, headers = await send("POST", self._sessions, body, {})
        token = headers.get("X-Auth-Token", "")
        if status >= 300 or not token:
            raise FabricApiError(
                status, "SessionLoginFailed",
                f"POST {self._sessions} as {self._username!r} answered no X-Auth-Token",
            )  # fmt: skip
        location = headers.get("Location", "")
        log.info("fabric: logged in as %s (session %s)", self._username, location or "?")
        return token, location

    async def refused(self, send: Send) -> bool:
        async with self._lock:
            had, self._session = self._session, None
        return had is not None

    async def close(self, send: Send) -> None:
        async with self._lock:
            session, self._session = self._session, None
        if session is not None and session[1]:
            try:
                await send("DELETE", session[1], None, {"X-Auth-Token": session[0]})
            except Exception as exc:  # logging out is best effort: the session expires anyway
                log.info("fabric: logout of %s failed: %s", session[1], exc)


class FabricAuthSettings(FabricTokenSettings):
    """The client's credentials: the bearer token settings plus Basic/session ones."""

    fabric_auth: AuthMode = Field(
        default="bearer",
        description="how the client authenticates to the fabric: bearer (fabric_token), "
        "basic or session (a Redfish session; both with fabric_username and "
        "fabric_password_file)",
    )
    fabric_username: str = Field(default="", description="user name for basic/session auth")
    fabric_password_file: Path | None = Field(
        default=None,
        description="file holding the password for basic/session auth, re-read when it changes",
    )

    @model_validator(mode="after")
    def _has_token(self) -> Self:  # replaces the bearer-only check of FabricTokenSettings
        if self.fabric_auth == "bearer":
            if not self.fabric_token and self.fabric_token_file is None:
                raise ValueError("set fabric_token or fabric_token_file (fabric_auth bearer)")
        elif not self.fabric_username or self.fabric_password_file is None:
            raise ValueError(
                f"set fabric_username and fabric_password_file (fabric_auth {self.fabric_auth})"
            )
        return self

    def fabric_credentials(self) -> Auth:
        if self.fabric_auth == "bearer":
            return Auth(self.token_source())
        password = TokenSource(path=self.fabric_password_file)
        if self.fabric_auth == "basic":
            return BasicAuth(self.fabric_username, password)
        return SessionAuth(self.fabric_username, password)
