"""TLS to the fabric API: the settings both ends share, and their SSL contexts.

Why this module exists: the fabric API carries a bearer token and attach
orders, so it is HTTPS by default. The service serves a certificate
(``--fabric-tls-cert``/``--fabric-tls-key``); the controller verifies it
against a CA bundle (``--fabric-ca-bundle``, else the system's trust store)
and checks the host name it names (``--fabric-server-name``, else the URL's
host: the chart connects to the Service's IP and checks its DNS name).
Plain HTTP is possible only with the explicit ``--fabric-insecure`` on both
ends (tests and trusted networks). One name per setting: the service and
the controller spell ``fabric_insecure`` the same, owned here.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, model_validator

INSECURE_HINT = "set fabric_insecure to allow plain HTTP"


class FabricInsecureSetting(BaseModel):
    fabric_insecure: bool = Field(
        default=False,
        description="allow the fabric API over plain HTTP, without TLS (tests, trusted networks)",
    )


class FabricTlsClientSettings(FabricInsecureSetting):
    fabric_ca_bundle: Path | None = Field(
        default=None,
        description="PEM file of the CA that signs the fabric's certificate; unset: the "
        "system's trust store",
    )
    fabric_server_name: str = Field(
        default="",
        description="host name the fabric's certificate must carry; empty: the fabric URL's host",
    )

    def client_ssl(self) -> ssl.SSLContext:
        """A context that verifies the chain against the bundle and the host name."""
        ctx = ssl.create_default_context(
            cafile=str(self.fabric_ca_bundle) if self.fabric_ca_bundle else None
        )
        ctx.check_hostname = True
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def check_url(url: str, insecure: bool) -> None:
    """``url`` is HTTPS, or HTTP with the insecure setting (ValueError else)."""
    if url.startswith("https://"):
        return
    if url.startswith("http://"):
        if not insecure:
            raise ValueError(f"fabric_url {url} is plain HTTP: {INSECURE_HINT}")
        return
    raise ValueError(f"fabric_url {url}: want https://host:port")


class FabricTlsServerSettings(FabricInsecureSetting):
    fabric_tls_cert: Path | None = Field(
        default=None, description="PEM certificate (chain) the fabric API serves"
    )
    fabric_tls_key: Path | None = Field(default=None, description="PEM private key of that cert")

    @model_validator(mode="after")
    def _tls_or_insecure(self) -> Self:
        given = (self.fabric_tls_cert is not None, self.fabric_tls_key is not None)
        if given == (True, False) or given == (False, True):
            raise ValueError("set both fabric_tls_cert and fabric_tls_key")
        if given == (False, False) and not self.fabric_insecure:
            raise ValueError(f"set fabric_tls_cert and fabric_tls_key, or {INSECURE_HINT}")
        return self

    def server_ssl(self) -> ssl.SSLContext | None:
        """The serving context; None: plain HTTP (the insecure setting)."""
        if self.fabric_tls_cert is None or self.fabric_tls_key is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.fabric_tls_cert, self.fabric_tls_key)
        return ctx
