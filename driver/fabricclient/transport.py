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
- a transport failure is :class:`FabricUnreachable` (a refused TLS
  certificate :class:`FabricTlsError`, saying why; a timeout says how long);
- every error names the request (method and URI) and what was expected;
- credentials go to the fabric's origin only: redirects are not left to
  aiohttp (which would send ``X-Auth-Token``, and any header of ours, to
  wherever a redirect points). One to the same origin (scheme, host, port)
  is followed; one to another is :class:`FabricRedirectRefused`, naming
  both origins, and nothing is sent there;
- a body larger than ``fabric_max_body_bytes`` (:mod:`limits`) is not read
  on: :class:`FabricResourceBroken` naming the resource; so is a body cut
  short (the connection closed before its ``Content-Length``).
"""

from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import ValidationError
from yarl import URL

from driver.errors import (
    FabricApiError,
    FabricConflict,
    FabricMalformed,
    FabricNotFound,
    FabricRedirectRefused,
    FabricResourceBroken,
    FabricTlsError,
    FabricUnreachable,
)
from driver.fabricclient import wire_tasks
from driver.fabricclient.auth import Auth
from driver.fabricclient.limits import MAX_BODY_BYTES

log = logging.getLogger(__name__)
QUOTE = 200  # characters of a non-Redfish error body quoted in the error
REDIRECTS = {301, 302, 303, 307, 308}
MAX_REDIRECTS = 5  # same-origin hops followed for one request
CHUNK = 64 << 10


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: Any  # the decoded JSON; None when the body was empty

    def json_object(self, where: str) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise FabricMalformed(
                f"fabric {where}: HTTP {self.status}: expected a JSON object, got "
                f"{type(self.body).__name__}"
            )
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
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.origin = origin(URL(self.base_url))
        self.max_body_bytes = max_body_bytes
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

    def transport_error(self, what: str, exc: Exception) -> FabricUnreachable:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            host = self.server_name or exc.host
            return FabricTlsError(
                f"{what}: the fabric's TLS certificate was refused for host {host}"
                f" (wrong CA bundle, host name or expired?): {exc.certificate_error}"
            )
        if isinstance(exc, TimeoutError):  # aiohttp's own timeouts are TimeoutErrors too
            return FabricUnreachable(
                f"{what}: no answer within {self.timeout.total:g} s (the client's fabric "
                f"timeout){f': {exc}' if str(exc) else ''}"
            )
        return FabricUnreachable(f"{what}: {type(exc).__name__}: {exc}")

    async def _exchange(
        self, method: str, uri: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        url = URL(self.base_url + uri)
        try:
            for _ in range(MAX_REDIRECTS + 1):
                async with self.session().request(
                    method, url, json=body, headers=headers, allow_redirects=False,
                    server_hostname=self.server_name,
                ) as resp:  # fmt: skip
                    target = self._redirect(method, uri, url, resp)
                    if target is None:
                        return resp.status, dict(resp.headers), await self._read(method, uri, resp)
                url = target
        except aiohttp.ClientPayloadError as exc:
            raise FabricResourceBroken(
                f"fabric {method} {uri}: the body was cut short (expected the whole "
                f"Content-Length): {exc}", uri,
            ) from exc  # fmt: skip
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self.transport_error(f"fabric {method} {uri}", exc) from exc
        raise FabricUnreachable(f"fabric {method} {uri}: more than {MAX_REDIRECTS} redirects")

    def _redirect(
        self, method: str, uri: str, url: URL, resp: aiohttp.ClientResponse
    ) -> URL | None:
        """Where a redirect answer points (same origin only), or None for any other."""
        location = resp.headers.get("Location")
        if resp.status not in REDIRECTS or location is None:
            return None
        target = url.join(URL(location))
        if origin(target) != self.origin:
            raise FabricRedirectRefused(
                f"fabric {method} {uri}: HTTP {resp.status} redirects from {self.origin} to "
                f"{origin(target)}, another origin: not followed (no credential is sent "
                "anywhere but the fabric's own origin)"
            )
        if resp.status in (301, 302, 303) and method not in ("GET", "HEAD"):
            raise FabricApiError(resp.status, "RedirectNotFollowed",
                                 f"redirects a {method} to {target.path} (only 307/308 keep "
                                 "a request's method and body)", method, uri)  # fmt: skip
        log.info("fabric %s %s: HTTP %s to %s, following", method, uri, resp.status, target.path)
        return target

    async def _read(self, method: str, uri: str, resp: aiohttp.ClientResponse) -> bytes:
        """The body, up to ``max_body_bytes`` (else :class:`FabricResourceBroken`)."""
        cap, length = self.max_body_bytes, resp.content_length
        data = bytearray()
        if length is None or length <= cap:
            async for chunk in resp.content.iter_chunked(CHUNK):
                data += chunk
                if len(data) > cap:
                    break
            else:
                return bytes(data)
        raise FabricResourceBroken(
            f"fabric {method} {uri}: the body is over the limit of {cap} bytes (setting "
            f"fabric_max_body_bytes){f', Content-Length {length}' if length else ''}", uri,
        )  # fmt: skip

    async def _send(
        self, method: str, uri: str, body: dict[str, str] | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """For the credentials themselves (login, logout): no auth added."""
        return await self._exchange(method, uri, body, headers)

    async def auth_headers(self) -> dict[str, str]:
        return await self.auth.headers(self._send)

    async def get_text(self, uri: str) -> str:
        """A non-JSON resource (``$metadata``) as text."""
        sent = await self.auth_headers()
        status, _, raw = await self._exchange("GET", uri, None, sent)
        if status >= 400:
            raise api_error(status, _decode(raw), "GET", uri)
        return raw.decode(errors="replace")

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
            if status == 401 and attempt == 1 and await self.auth.refused(self._send, sent):
                log.info("fabric %s %s: 401, logging in again", method, uri)
                continue
            break
        if status >= 400:
            raise api_error(status, _decode(raw), method, uri)
        if not raw.strip():
            return Response(status, resp_headers, None)
        try:
            return Response(status, resp_headers, json.loads(raw))
        except ValueError as exc:
            raise FabricMalformed(
                f"fabric {method} {uri}: HTTP {status}: expected a JSON body: {exc}", uri
            ) from exc

    async def get(self, uri: str) -> dict[str, Any]:
        return (await self.request("GET", uri)).json_object(f"GET {uri}")


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def origin(url: URL) -> str:
    """``scheme://host:port``, what a credential is bound to."""
    return f"{url.scheme}://{url.host}:{url.port}"


def api_error(status: int, data: Any, method: str = "", uri: str = "") -> FabricApiError:
    """The error for an answer of ``status`` (400 or more, where a success was
    expected) to ``method`` ``uri`` with body ``data``."""
    try:
        info = wire_tasks.ErrorBody.model_validate(data).error
        message = info.message or "; ".join(m.message for m in info.extended if m.message)
        code = info.code
    except ValidationError:
        text = data if isinstance(data, str) else json.dumps(data)
        code, message = "Base.GeneralError", " ".join(text.split())[:QUOTE] or "(empty body)"
    cls = {409: FabricConflict, 404: FabricNotFound}.get(status, FabricApiError)
    return cls(status, code.rsplit(".", 1)[-1], message, method, uri)
