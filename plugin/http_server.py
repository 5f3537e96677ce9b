"""The plugin's HTTP endpoint: Prometheus ``/metrics`` and ``/healthz``.

Served on the plugin's asyncio loop with aiohttp (already loaded by the
Kubernetes client, so it costs no extra memory). Disabled when
``--metrics-port`` is 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from driver.metrics import REGISTRY

log = logging.getLogger(__name__)


async def serve_http(port: int, healthy: Callable[[], bool], host: str = "0.0.0.0") -> None:
    """Serve until cancelled."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=REGISTRY.render(), content_type="text/plain")

    async def healthz(_: web.Request) -> web.Response:
        ok = healthy()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not ready\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("serving /metrics and /healthz on %s:%d", host, port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
