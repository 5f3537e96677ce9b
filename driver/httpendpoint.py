"""A process's HTTP endpoint: Prometheus ``/metrics`` and ``/healthz``.

Why one module: the node plugin and the controller serve the same two paths
the same way, each with its own registry (``driver.metrics``) and its own
health test, on the port of their ``--metrics-port`` setting
(:class:`MetricsPortSettings`; 0 disables the endpoint). Served on the
process's asyncio loop with aiohttp's server, imported when an endpoint
starts: with the port at 0 a process does not pay for it (about 1.7 MB
resident; the Kubernetes aio client loads only aiohttp's client). A scrape
renders the registry on the loop, where the state the sampled gauges read
lives. :func:`serve_app`
is the serving part alone, which the controller's admission webhook
(``driver.controller.process.webhook``) uses with its TLS context.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)


class MetricsPortSettings(BaseModel):
    """The endpoint's one setting (flag ``--metrics-port``, env ``METRICS_PORT``)."""

    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="port for /metrics and /healthz; 0 disables"
    )


async def serve_http(
    port: int,
    registry: CollectorRegistry,
    healthy: Callable[[], bool],
    host: str = "0.0.0.0",
    detail: Callable[[], list[str]] | None = None,
) -> None:
    """Serve until cancelled. ``detail``: lines ``/healthz`` adds to its
    answer (what works only in part, and why), whatever its status."""
    from aiohttp import web  # once an endpoint is served (module docstring)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = healthy()
        lines = ["ok" if ok else "not ready", *(detail() if detail is not None else ())]
        return web.Response(status=200 if ok else 503, text="".join(f"{ln}\n" for ln in lines))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    await serve_app(app, host, port, None, "/metrics and /healthz")


async def serve_app(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None, what: str
) -> None:
    """Serve ``app`` on ``host:port`` (HTTPS with ``tls``) until cancelled."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    log.info("serving %s on %s:%d%s", what, host, port, " over TLS" if tls else "")
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
