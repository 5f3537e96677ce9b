"""One HTTP exchange with the fabric: session, credentials, TLS and error mapping.

Why a module: every request of the client (reads, operations, task polls,
the event stream) needs the same things done the same way, and the
readers and dialects should see only Redfish bodies and our errors:

- the credentials of :mod:`auth` on each request; a 401 under a session
  logs in again and sends the request once more;
- an answer of 400 or more becomes :class:`FabricApiError` (409
  :class:`FabricConflict`, 404 :class:`FabricNotFound`) whatever its body:
  a Redfish error body gives its MessageId and message, any other body
  (HTML from a proxy, plain text) is quoted with the HTTP status, never
  turned into :class:`FabricMalformed`;
- a success whose body is not JSON is :class:`FabricMalformed`; an empty
  one (204) is None;
- a transport failure is :class:`FabricUnavailable` (a refused TLS
  certificate :class:`FabricTlsError`, saying why).
"""

from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import ValidationError

from driver.errors import (
    FabricApiError,
    FabricConflict,
    FabricMalformed,
    FabricNotFound,
    FabricTlsError,
    FabricUnavailable,
)
from driver.fabricclient import wire
from driver.fabricclient.auth import Auth

log = logging.getLogger(__name__)
QUOTE = 200  # characters of a non-Redfish error body quoted in the error


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: Any  # the decoded JSON; None when the body was empty

    def json_object(self, where: str) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise FabricMalformed(f"fabric {where}: HTTP {self.status} body is not a JSON object")
        return self.body


class Transport:
    """``tls``: the context that verifies an https:// fabric; ``server_name``:
    the host name its certificate must carry when it is not the URL's host."""

    def __init__(
        self,
        base_url: str,
        auth: Auth,
        timeout_s: float = 10.0,
        tls: ssl.SSLContext | None = None,
        server_name: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.auth = auth
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._tls = tls
        self.server_name = server_name or None
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls else None
            self._session = aiohttp.ClientSession(
                headers={"Accept": "application/json"}, timeout=self.timeout, connector=connector
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self.auth.close(self._send)
            await self._session.close()
            self._session = None

    def transport_error(self, what: str, exc: Exception) -> FabricUnavailable:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            host = self.server_name or exc.host
            return FabricTlsError(
                f"{what}: the fabric's TLS certificate was refused for host {host}"
                f" (wrong CA bundle, host name or expired?): {exc.certificate_error}"
            )
        return FabricUnavailable(f"{what}: {exc}")

    async def _exchange(
        self, method: str, uri: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        try:
            async with self.session().request(
                method, self.base_url + uri, json=body, headers=headers,
                server_hostname=self.server_name,
            ) as resp:  # fmt: skip
                return resp.status, dict(resp.headers), await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self.transport_error(f"fabric {method} {uri}", exc) from exc

    async def _send(
        self, method: str, uri: str, body: dict[str, str] | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str]]:
        """For the credentials themselves (login, logout): no auth added."""
        status, resp_headers, _ = await self._exchange(method, uri, body, headers)
        return status, resp_headers

    async def auth_headers(self) -> dict[str, str]:
        return await self.auth.headers(self._send)

    async def request(
        self,
        method: str,
        uri: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        for attempt in (1, 2):
            sent = {**(headers or {}), **await self.auth_headers()}
            status, resp_headers, raw = await self._exchange(method, uri, body, sent)
            if status == 401 and attempt == 1 and await self.auth.refused(self._send):
                log.info("fabric %s %s: 401, logging in again", method, uri)
                continue
            break
        if status >= 400:
            raise api_error(status, _decode(raw))
        if not raw.strip():
            return Response(status, resp_headers, None)
        try:
            return Response(status, resp_headers, json.loads(raw))
        except ValueError as exc:
            raise FabricMalformed(f"fabric {method} {uri}: body is not JSON: {exc}") from exc

    async def get(self, uri: str) -> dict[str, Any]:
        return (await self.request("GET", uri)).json_object(f"GET {uri}")


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def api_error(status: int, data: Any) -> FabricApiError:
    """The error for an answer of ``status`` (400 or more) with body ``data``."""
    try:
        info = wire.ErrorBody.model_validate(data).error
        message = info.message or "; ".join(m.message for m in info.extended if m.message)
        code = info.code
    except ValidationError:
        text = data if isinstance(data, str) else json.dumps(data)
        code, message = "Base.GeneralError", " ".join(text.split())[:QUOTE] or "(empty body)"
    cls = {409: FabricConflict, 404: FabricNotFound}.get(status, FabricApiError)
    return cls(status, code.rsplit(".", 1)[-1], message)
