"""The controller's admission webhook endpoint: HTTPS, its settings, its certificate.

Why this module exists: the apiserver calls admission webhooks over TLS
only, so the controller serves ``/validate`` (:mod:`driver.controller.process.admission`)
and ``/healthz`` (the readiness probe) on its own port
(``--webhook-port``, 0: no webhook) with the certificate and key of
``--webhook-tls-cert``/``--webhook-tls-key``. Every replica serves, the
leader and the followers alike (it needs no state, only the decoder), so
the Service's endpoints are all replicas and a leader change never
interrupts admission.

The certificate is rotated by rewriting its files (a mounted Secret, or
cert-manager renewing it): each TLS handshake stats both files and, when
their inode, size or mtime changed, loads them into a new context, which
that handshake and the later ones use (like ``driver.fabricclient.token``
re-reads the token). A pair that does not load (a half-written rotation)
is logged and the previous one kept.
"""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path
from typing import Self

from aiohttp import web
from pydantic import BaseModel, Field, model_validator

from driver.controller.process import admission
from driver.errors import ConfigError
from driver.httpendpoint import serve_app

log = logging.getLogger(__name__)

PATH = "/validate"  # the path the chart's ValidatingWebhookConfiguration names


class WebhookSettings(BaseModel):
    webhook_port: int = Field(
        default=0, ge=0, le=65535, description="HTTPS port of the admission webhook; 0 disables"
    )
    webhook_tls_cert: Path | None = Field(
        default=None, description="PEM certificate (chain) the webhook serves, re-read on change"
    )
    webhook_tls_key: Path | None = Field(
        default=None, description="PEM private key of that certificate, re-read on change"
    )

    @model_validator(mode="after")
    def _cert_with_port(self) -> Self:
        if self.webhook_port and (self.webhook_tls_cert is None or self.webhook_tls_key is None):
            raise ValueError("webhook_port needs webhook_tls_cert and webhook_tls_key")
        return self


class CertFiles:
    """A serving context whose certificate follows its files."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._cert, self._key = cert, key
        self._seen: tuple[tuple[int, int, int], ...] = ()
        self._current = self._load()  # a pair that does not load at start is fatal
        self.context = self._current  # the site's; each handshake moves to current()
        self.context.sni_callback = self._handshake

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        stats = (self._cert.stat(), self._key.stat())
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def _load(self) -> ssl.SSLContext:
        stamp = self._stamp()
        ctx = self._context()
        try:
            ctx.load_cert_chain(self._cert, self._key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"webhook certificate {self._cert} / key {self._key}: {exc}") from exc
        self._seen = stamp
        return ctx

    def current(self) -> ssl.SSLContext:
        """The context of the files as they are now (or the last pair that loaded)."""
        try:
            if self._stamp() != self._seen:
                self._current = self._load()
                log.info("webhook certificate %s changed: serving the new one", self._cert)
        except (OSError, ConfigError) as exc:
            log.warning("webhook certificate not reloaded, keeping the previous one: %s", exc)
        return self._current

    def _handshake(self, conn: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        conn.context = self.current()


async def _validate(request: web.Request) -> web.Response:
    try:
        answer = admission.review(json.loads(await request.read()))
    except (ValueError, ConfigError) as exc:  # JSONDecodeError is a ValueError
        return web.Response(status=400, text=f"{exc}\n")
    return web.json_response(answer)


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def serve_webhook(settings: WebhookSettings, host: str = "0.0.0.0") -> None:
    """Serve the webhook until cancelled (``webhook_port`` must be set)."""
    assert settings.webhook_tls_cert is not None and settings.webhook_tls_key is not None
    certs = CertFiles(settings.webhook_tls_cert, settings.webhook_tls_key)
    app = web.Application()
    app.router.add_post(PATH, _validate)
    app.router.add_get("/healthz", _healthz)
    await serve_app(app, host, settings.webhook_port, certs.context, f"the webhook ({PATH})")
