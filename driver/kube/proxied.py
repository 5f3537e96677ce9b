"""The apiserver through an HTTP proxy (a kubeconfig's ``proxy-url``), on aiohttp.

Why this module exists: :mod:`driver.kube.http1` speaks to the apiserver
directly and knows no proxy (CONNECT tunnels, proxy credentials). A
proxied cluster is rare for a node plugin (in-cluster configuration never
names one), so this keeps aiohttp's client for that case only, behind the
same two calls as :class:`driver.kube.http1.Http1Client` (``request`` and
``stream``). :class:`driver.kube.api.KubeApi` imports it only when a proxy
is set, so no other process pays for aiohttp's import (megabytes resident).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import aiohttp

from driver.kube.http1 import MAX_OPEN


class ProxiedClient:
    """Requests to ``host`` through ``proxy`` (``http://[user:pass@]proxy:port``)."""

    def __init__(
        self,
        host: str,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None,
        proxy: str,
    ) -> None:
        self._host = host
        self._proxy = proxy
        self._server_hostname = server_hostname
        # trust_env stays off: the session would re-read proxy settings and
        # ~/.netrc on every request; the kubeconfig names the proxy.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=ssl_context if ssl_context is not None else True, limit=MAX_OPEN
            ),
            read_bufsize=2**20,  # watch events can be large
        )

    async def close(self) -> None:
        await self._session.close()

    async def _send(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> aiohttp.ClientResponse:
        try:
            return await self._session.request(
                method,
                self._host + path,
                headers=headers,
                data=body,
                proxy=self._proxy,
                server_hostname=self._server_hostname,
            )
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]:
        resp = await self._send(method, path, headers, body)
        try:
            return resp.status, await resp.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc
        finally:
            resp.release()

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        return await self.request("GET", path, headers)

    async def stream(self, method: str, path: str, headers: dict[str, str]) -> ProxiedStream:
        return ProxiedStream(await self._send(method, path, headers, None))


class ProxiedStream:
    """:class:`driver.kube.http1_body.StreamResponse`'s calls on aiohttp's response."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc
        finally:
            self.close()

    async def lines(self, deadline: float | None = None) -> AsyncIterator[bytes]:
        try:
            while True:
                async with asyncio.timeout_at(deadline):
                    line = await self._resp.content.readline()
                if not line:
                    return
                yield line.rstrip(b"\n")
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc
        finally:
            self.close()

    def close(self) -> None:
        self._resp.release()
