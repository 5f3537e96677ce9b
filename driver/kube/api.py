"""The one module that talks to the Kubernetes API client.

We use the ``kubernetes`` package's asyncio client for what it does well
(kubeconfig and in-cluster configuration, TLS, token refresh) and send raw
JSON requests: GETs (a prepare's claim read) through the lean keep-alive
client of :mod:`driver.kube.http1` on the client's TLS context, writes and
watches (and everything, behind a proxy) through an aiohttp session. The
generated typed models are skipped on purpose: they cost memory and CPU per
object, and the rest of patchbay reads only a handful of fields. Watches
stream the response body line by line.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import sys
from collections.abc import AsyncIterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp

from driver.errors import ApiError, ApiStatusError
from driver.kube.http1 import Http1Getter

if TYPE_CHECKING:
    from kubernetes.aio.client import api_client

log = logging.getLogger(__name__)

RESOURCE_V1 = "/apis/resource.k8s.io/v1"
REQUEST_TIMEOUT_S = 30.0  # one request, answer included (watches have their own)
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


def _client_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """The aio client's config, api_client and configuration modules, imported
    on first use and without the package's ``__init__`` files: those import
    the whole synchronous client, its watch, stream (websocket), dynamic and
    informer packages, about 8 MB resident that the aio part never uses.
    Bare package modules stand in for ``kubernetes`` and ``kubernetes.aio``
    unless a process imported the package already (the tests' clients); a
    later ``from kubernetes import x`` still imports the submodule x. This
    relies on the package's layout, hence the upper bound on ``kubernetes``
    in pyproject.toml (tests/unit/test_kube_imports.py checks it)."""
    for name in ("kubernetes", "kubernetes.aio"):
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            break  # not the layout we know: import it the ordinary way
        sys.modules[name] = importlib.util.module_from_spec(spec)  # not executed
    from kubernetes.aio import config as kconfig
    from kubernetes.aio.client import api_client, configuration

    return kconfig, api_client, configuration


class KubeApi:
    """A thin asynchronous JSON client on top of the official one."""

    def __init__(self, client: api_client.ApiClient) -> None:
        self._client = client
        self._session: aiohttp.ClientSession | None = None
        conf = client.configuration
        # GETs (the claim read of every prepare) take the lean path; through
        # a proxy, everything goes through aiohttp.
        self._getter = (
            None
            if conf.proxy
            else Http1Getter(
                conf.host, client.rest_client.ssl_context, conf.tls_server_name or None
            )
        )

    @classmethod
    async def connect(cls, kubeconfig: str | None, context: str | None = None) -> KubeApi:
        """Load a kubeconfig file (``context`` in it, or its current one), or
        the in-cluster config when none is given."""
        kconfig, api_client, configuration = _client_modules()
        conf = configuration.Configuration()
        try:
            if kubeconfig:
                await kconfig.load_kube_config(
                    config_file=kubeconfig, context=context, client_configuration=conf
                )
            else:
                kconfig.load_incluster_config(client_configuration=conf)
        except Exception as exc:
            raise ApiError(f"cannot load Kubernetes client configuration: {exc}") from exc
        return cls(api_client.ApiClient(configuration=conf))

    async def close(self) -> None:
        if self._getter is not None:
            await self._getter.close()
        if self._session is not None:
            await self._session.close()
        await self._client.close()

    def _http(self) -> aiohttp.ClientSession:
        # Our own session on the client's TLS context: the client's session
        # trusts the environment, which re-reads proxy settings and ~/.netrc
        # on every request (about a millisecond per call on a busy node).
        if self._session is None:
            conf = self._client.configuration
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=self._client.rest_client.ssl_context,
                    limit=conf.connection_pool_maxsize or 16,
                ),
                read_bufsize=2**20,  # watch events can be large
            )
        return self._session

    async def _headers(self, content_type: str | None = "application/json") -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if content_type is not None:
            headers["Content-Type"] = content_type
        auth = (await self._client.configuration.auth_settings()).get("BearerToken")
        if auth:
            headers["Authorization"] = auth["value"]
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = REQUEST_TIMEOUT_S,
    ) -> aiohttp.ClientResponse:
        # The generated request path (parameter sanitising, per-call
        # serialisation) costs about a millisecond per call; we use the
        # client's TLS context (client certificates) and its auth settings
        # (bearer tokens, refreshed by its hook) directly.
        conf = self._client.configuration
        headers = await self._headers(content_type)
        url = conf.host + _with_query(path, query)
        data = None if body is None else json.dumps(body).encode()
        try:
            return await self._http().request(
                method,
                url,
                headers=headers,
                proxy=conf.proxy or None,
                data=data,
                timeout=aiohttp.ClientTimeout(total=request_timeout),
                server_hostname=conf.tls_server_name or None,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unreachable(method, path, exc) from exc

    async def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObj:
        """One request; the decoded JSON answer, or :class:`ApiStatusError`."""
        resp = await self._request(method, path, query, body, content_type)
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unreachable(method, path, exc) from exc
        finally:
            resp.release()
        if not 200 <= resp.status < 300:
            raise ApiStatusError(method, path, resp.status, raw.decode(errors="replace"))
        result: JsonObj = json.loads(raw) if raw else {}
        return result

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> JsonObj:
        if self._getter is None:
            return await self.call("GET", path, query)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, raw = await self._getter.get(
                    _with_query(path, query), await self._headers(None)
                )
        except (OSError, TimeoutError) as exc:  # ConnectionError and ssl.SSLError too
            raise unreachable("GET", path, exc) from exc
        if not 200 <= status < 300:
            raise ApiStatusError("GET", path, status, raw.decode(errors="replace"))
        result: JsonObj = json.loads(raw) if raw else {}
        return result

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
        server ends the watch; the caller re-lists or re-watches."""
        q = dict(query)
        q.update(watch="true", allowWatchBookmarks="true", timeoutSeconds=timeout_seconds)
        resp = await self._request("GET", path, q, request_timeout=timeout_seconds + 30)
        if resp.status != 200:
            raw = await resp.read()
            resp.release()
            raise ApiStatusError("WATCH", path, resp.status, raw.decode(errors="replace"))
        try:
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unreachable("watch", path, exc) from exc
        finally:
            resp.release()
