"""The one module that talks to the Kubernetes API: :class:`KubeApi`.

Configuration comes from :mod:`driver.kube.kubeconfig` (a kubeconfig file
or the in-cluster files: server, TLS, credentials) and every request, the
watches included, goes through the lean keep-alive client of
:mod:`driver.kube.http1`; only a cluster behind a proxy (``proxy-url``)
goes through aiohttp (:mod:`driver.kube.proxied`, imported then). Requests
and answers are raw JSON: typed models would cost memory and CPU per
object, and the rest of patchbay reads only a handful of fields. Watches
stream the response body line by line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from driver.errors import ApiError, ApiStatusError
from driver.kube.clientconfig import ClientConfig
from driver.kube.http1 import Http1Client
from driver.kube.kubeconfig import load_incluster, load_kubeconfig

if TYPE_CHECKING:
    from driver.kube.proxied import ProxiedClient

log = logging.getLogger(__name__)

RESOURCE_V1 = "/apis/resource.k8s.io/v1"
REQUEST_TIMEOUT_S = 30.0  # one request, answer included (watches have their own)
WATCH_GRACE_S = 30  # a watch may outlive the timeoutSeconds it asked for by this much
USER_AGENT = "patchbay"
JsonObj = dict[str, Any]


def unreachable(method: str, path: str, exc: BaseException) -> ApiError:
    """A request that got no answer: the message says so in words (a kubelet
    shows it on the pod), then what the transport said."""
    detail = str(exc) or ("no answer in time" if isinstance(exc, TimeoutError) else repr(exc))
    return ApiError(f"{method} {path}: the Kubernetes API is unreachable: {detail}")


def _with_query(path: str, query: Mapping[str, Any] | None) -> str:
    params = {k: str(v) for k, v in (query or {}).items() if v is not None}
    return path + ("?" + urlencode(params) if params else "")


def claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}"


def slice_path(name: str | None = None) -> str:
    base = f"{RESOURCE_V1}/resourceslices"
    return base if name is None else f"{base}/{name}"


class KubeApi:
    """A thin asynchronous JSON client of the apiserver."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._http: Http1Client | ProxiedClient
        if config.proxy:
            from driver.kube.proxied import ProxiedClient  # aiohttp: only behind a proxy

            self._http = ProxiedClient(
                config.server, config.ssl_context, config.tls_server_name, config.proxy
            )
        else:
            self._http = Http1Client(config.server, config.ssl_context, config.tls_server_name)

    @classmethod
    async def connect(cls, kubeconfig: str | None, context: str | None = None) -> KubeApi:
        """Load a kubeconfig file (``context`` in it, or its current one), or
        the in-cluster config when none is given."""
        try:
            config = load_kubeconfig(Path(kubeconfig), context) if kubeconfig else load_incluster()
        except ApiError as exc:
            raise ApiError(f"cannot load Kubernetes client configuration: {exc}") from exc
        return cls(config)

    async def close(self) -> None:
        await self._http.close()

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if content_type is not None:
            headers["Content-Type"] = content_type
        auth = await self.config.credentials.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    async def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObj:
        """One request; the decoded JSON answer, or :class:`ApiStatusError`."""
        data = None if body is None else json.dumps(body).encode()
        headers = await self._headers(None if data is None else content_type)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, raw = await self._http.request(
                    method, _with_query(path, query), headers, data
                )
        except (OSError, TimeoutError) as exc:  # ConnectionError and ssl.SSLError too
            raise unreachable(method, path, exc) from exc
        if not 200 <= status < 300:
            raise ApiStatusError(method, path, status, raw.decode(errors="replace"))
        result: JsonObj = json.loads(raw) if raw else {}
        return result

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> JsonObj:
        return await self.call("GET", path, query)

    async def create(self, path: str, body: JsonObj) -> JsonObj:
        return await self.call("POST", path, body=body)

    async def replace(self, path: str, body: JsonObj) -> JsonObj:
        return await self.call("PUT", path, body=body)

    async def merge_patch(self, path: str, body: JsonObj) -> JsonObj:
        return await self.call(
            "PATCH", path, body=body, content_type="application/merge-patch+json"
        )

    async def apply(
        self, path: str, body: JsonObj, field_manager: str, force: bool = False
    ) -> JsonObj:
        query = {"fieldManager": field_manager, "force": "true" if force else None}
        return await self.call(
            "PATCH", path, query, body=body, content_type="application/apply-patch+yaml"
        )

    async def delete(self, path: str, body: JsonObj | None = None) -> JsonObj:
        return await self.call("DELETE", path, body=body)

    async def watch(
        self, path: str, query: Mapping[str, Any], timeout_seconds: int = 300
    ) -> AsyncIterator[JsonObj]:
        """Stream watch events (``{"type": ..., "object": ...}``) until the
        server ends the watch; the caller re-lists or re-watches. The watch
        has ``timeout_seconds`` + :data:`WATCH_GRACE_S` in all; cancelling
        the consumer closes its connection."""
        q = dict(query)
        q.update(watch="true", allowWatchBookmarks="true", timeoutSeconds=timeout_seconds)
        deadline = asyncio.get_running_loop().time() + timeout_seconds + WATCH_GRACE_S
        headers = await self._headers(None)
        try:
            async with asyncio.timeout_at(deadline):
                resp = await self._http.stream("GET", _with_query(path, q), headers)
        except (OSError, TimeoutError) as exc:
            raise unreachable("watch", path, exc) from exc
        try:
            if resp.status != 200:
                async with asyncio.timeout_at(deadline):
                    raw = await resp.read()
                raise ApiStatusError("WATCH", path, resp.status, raw.decode(errors="replace"))
            async for line in resp.lines(deadline):
                if line.strip():
                    yield json.loads(line)
        except (OSError, TimeoutError) as exc:
            raise unreachable("watch", path, exc) from exc
        finally:
            resp.close()
