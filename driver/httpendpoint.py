"""A process's HTTP endpoint: Prometheus ``/metrics`` and ``/healthz``.

Why one module: the node plugin and the controller serve the same two paths
the same way, each with its own registry (``driver.metrics``) and its own
health test, on the port of their ``--metrics-port`` setting
(:class:`MetricsPortSettings`; 0 disables the endpoint). Served on the
process's asyncio loop by :mod:`driver.http1server` (GET and HEAD on two
paths; aiohttp's server cost the plugin about 1.5 MB resident for that). A
scrape renders the registry on the loop, where the state the sampled gauges
read lives. :func:`serve_app` serves an aiohttp application, imported when
it starts: the controller's admission webhook
(``driver.controller.process.webhook``) uses it with its TLS context.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from driver.http1server import GetServer, Reply

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

    def metrics() -> Reply:
        return Reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    def healthz() -> Reply:
        ok = healthy()
        lines = ["ok" if ok else "not ready", *(detail() if detail is not None else ())]
        return Reply(200 if ok else 503, "".join(f"{ln}\n" for ln in lines).encode())

    server = GetServer({"/metrics": metrics, "/healthz": healthz})
    await server.serve(host, port, "/metrics and /healthz")


async def serve_app(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None, what: str
) -> None:
    """Serve ``app`` on ``host:port`` (HTTPS with ``tls``) until cancelled."""
    from aiohttp import web  # the controller's webhook only (module docstring)

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    log.info("serving %s on %s:%d%s", what, host, port, " over TLS" if tls else "")
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
