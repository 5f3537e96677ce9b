"""KubeApi (driver/kube/api.py) on its own configuration and HTTP client,
against a real HTTP/1.1 server on a local socket: the token sent, JSON
bodies with their content types, statuses and unreachable servers as
errors, watches streamed, ended by the server and broken off; a
``proxy-url`` sent through aiohttp; and a process that connects, reads
and watches without a proxy never loading aiohttp or ``kubernetes``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from driver.errors import ApiError, ApiStatusError
from driver.kube.api import KubeApi
from tests.unit.local_http import Start, chunked_answer, length_answer, serving

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    async with serving() as start:
        yield start


def kubeconfig(tmp_path: Path, server: str, **cluster: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def test_get_decodes_and_sends_the_token(serve: Start, tmp_path: Path) -> None:
    srv = await serve(lambda _: length_answer(b'{"kind": "ResourceClaim"}'))
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.url)))
    try:
        got = await api.get("/apis/resource.k8s.io/v1/x", {"limit": 5, "continue": None})
        assert got == {"kind": "ResourceClaim"}
        assert srv.requests[0].startswith(b"GET /apis/resource.k8s.io/v1/x?limit=5 HTTP/1.1")
        assert b"Authorization: Bearer secret-token\r\n" in srv.requests[0]
    finally:
        await api.close()


async def test_writes_send_json_with_their_content_types(serve: Start, tmp_path: Path) -> None:
    srv = await serve(lambda _: length_answer(b'{"done": 1}'))
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.url)))
    try:
        assert await api.create("/o", {"a": 1}) == {"done": 1}
        await api.replace("/o/n", {"a": 2})
        await api.merge_patch("/o/n", {"a": 3})
        await api.apply("/o/n", {"a": 4}, "patchbay", force=True)
        await api.delete("/o/n")
    finally:
        await api.close()
    lines = [r.split(b"\r\n")[0] for r in srv.requests]
    assert lines == [
        b"POST /o HTTP/1.1",
        b"PUT /o/n HTTP/1.1",
        b"PATCH /o/n HTTP/1.1",
        b"PATCH /o/n?fieldManager=patchbay&force=true HTTP/1.1",
        b"DELETE /o/n HTTP/1.1",
    ]
    assert b"Content-Type: application/merge-patch+json\r\n" in srv.requests[2]
    assert b"Content-Type: application/apply-patch+yaml\r\n" in srv.requests[3]
    assert [json.loads(b) for b in srv.bodies[:4]] == [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}]
    assert srv.bodies[4] == b"" and srv.connections == 1


async def test_a_status_is_an_api_status_error(serve: Start, tmp_path: Path) -> None:
    srv = await serve(lambda _: length_answer(b'{"message": "no"}', status="409 Conflict"))
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.url)))
    try:
        with pytest.raises(ApiStatusError, match="POST /o: HTTP 409: no") as info:
            await api.create("/o", {})
        assert info.value.status == 409
        with pytest.raises(ApiStatusError) as info:
            await api.get("/o")
        assert info.value.status == 409
    finally:
        await api.close()


async def test_an_unreachable_server_is_named(tmp_path: Path) -> None:
    s = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = s.sockets[0].getsockname()[1]
    s.close()
    await s.wait_closed()
    api = await KubeApi.connect(str(kubeconfig(tmp_path, f"http://127.0.0.1:{port}")))
    try:
        with pytest.raises(
            ApiError, match="GET /api/v1/nodes/x: the Kubernetes API is unreachable"
        ):
            await api.get("/api/v1/nodes/x")
        with pytest.raises(ApiError, match="watch /n: the Kubernetes API is unreachable"):
            await anext(api.watch("/n", {}))
    finally:
        await api.close()


def test_a_bad_kubeconfig_says_so(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, "nope")
    with pytest.raises(ApiError, match=r"cannot load Kubernetes client configuration: kubeconfig"):
        asyncio.run(KubeApi.connect(str(path)))


EVENTS = [{"type": "ADDED", "object": {"n": i}} for i in range(3)]
STREAM = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)


async def test_a_watch_streams_events_until_the_server_ends_it(
    serve: Start, tmp_path: Path
) -> None:
    one = len(json.dumps(EVENTS[0])) + 1  # a blank line after the first event is skipped
    pieces = (STREAM[:10], STREAM[10:one], b"\n", STREAM[one : one + 5], STREAM[one + 5 :])
    srv = await serve(lambda _: chunked_answer(*pieces))
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.url)))
    try:
        got = [e async for e in api.watch("/w", {"resourceVersion": "7"}, timeout_seconds=9)]
    finally:
        await api.close()
    assert got == EVENTS
    head = srv.requests[0].split(b"\r\n")[0]
    assert head == (
        b"GET /w?resourceVersion=7&watch=true&allowWatchBookmarks=true&timeoutSeconds=9 HTTP/1.1"
    )


async def test_a_watch_refused_or_broken_off_raises(serve: Start, tmp_path: Path) -> None:
    gone = length_answer(b'{"message": "too old"}', status="410 Gone")
    srv = await serve(lambda _: gone)
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.url)))
    try:
        with pytest.raises(ApiStatusError, match="WATCH /w: HTTP 410: too old"):
            await anext(api.watch("/w", {}))
    finally:
        await api.close()
    srv = await serve(lambda _: chunked_answer(STREAM, last=False) + b"ff\r\nshort", 1)
    api = await KubeApi.connect(str(kubeconfig(tmp_path, srv.url)))
    got = []
    try:
        with pytest.raises(ApiError, match="watch /w: the Kubernetes API is unreachable"):
            async for event in api.watch("/w", {}):
                got.append(event)
    finally:
        await api.close()
    assert got == EVENTS


async def test_a_proxy_url_goes_through_the_proxy(serve: Start, tmp_path: Path) -> None:
    """The proxy (our local server) gets the absolute-form request line an
    HTTP proxy is sent; the answer and a watch come back through it."""

    def answer(head: bytes) -> bytes:
        return chunked_answer(STREAM) if b"watch=true" in head else length_answer(b'{"a": 1}')

    proxy = await serve(answer)
    api = await KubeApi.connect(
        str(kubeconfig(tmp_path, "http://apiserver.invalid:6443", **{"proxy-url": proxy.url}))
    )
    try:
        assert [e async for e in api.watch("/w", {})] == EVENTS
        assert await api.create("/o", {"b": 2}) == {"a": 1}
    finally:
        await api.close()
    assert proxy.requests[0].startswith(b"GET http://apiserver.invalid:6443/w?")
    assert b"Authorization: Bearer secret-token\r\n" in proxy.requests[0]
    assert proxy.requests[1].startswith(b"POST http://apiserver.invalid:6443/o HTTP/1.1")
    assert proxy.bodies[1] == b'{"b": 2}'


def test_without_a_proxy_neither_aiohttp_nor_kubernetes_is_loaded(
    serve: Start, tmp_path: Path
) -> None:
    code = textwrap.dedent(
        """
        import asyncio, pathlib, sys
        from driver.kube.api import KubeApi
        from tests.unit.local_http import chunked_answer, serving

        async def main(kubeconfig):
            async with serving() as start:
                srv = await start(lambda _: chunked_answer(b'{"type": "ADDED"}\\n'))
                path = pathlib.Path(kubeconfig)
                path.write_text(path.read_text().replace("PORT", str(srv.port)))
                api = await KubeApi.connect(kubeconfig)
                assert [e async for e in api.watch("/w", {})] == [{"type": "ADDED"}]
                await api.create("/o", {})
                await api.close()

        asyncio.run(main(sys.argv[1]))
        print(" ".join(m for m in sys.modules if m.split(".")[0] in ("aiohttp", "kubernetes")))
        print("ran")
        """
    )
    path = kubeconfig(tmp_path, "http://127.0.0.1:PORT")
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ran"]
