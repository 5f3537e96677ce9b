"""Where and how to reach the apiserver: :class:`ClientConfig`.

Why this module exists: :mod:`driver.kube.kubeconfig` reads a kubeconfig
file or the in-cluster files into this one shape, and
:class:`driver.kube.api.KubeApi` connects with it, so neither knows the
other's details. It holds the server's URL, the TLS context (trusted CAs,
client certificate, server name), an optional proxy, and the credentials
that make the ``Authorization`` header: a fixed one (a token, basic auth)
or a token file re-read now and then, as client-go does for the bound
service-account tokens that the kubelet rotates.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from driver.errors import ApiError

log = logging.getLogger(__name__)

# How often a token file is read again (client-go's cached file token
# source re-reads the service-account token every minute).
TOKEN_REREAD_S = 60.0


class Credentials:
    """The ``Authorization`` header to send; None sends none."""

    async def authorization(self) -> str | None:
        return None


class FixedCredentials(Credentials):
    def __init__(self, header: str) -> None:
        self._header = header

    async def authorization(self) -> str | None:
        return self._header


def bearer(token: str) -> FixedCredentials:
    return FixedCredentials(f"Bearer {token}")


def basic(username: str, password: str) -> FixedCredentials:
    pair = base64.b64encode(f"{username}:{password}".encode()).decode()
    return FixedCredentials(f"Basic {pair}")


class TokenFile(Credentials):
    """A bearer token read from ``path`` at most every ``reread_s`` seconds
    (monotonic); a read that fails keeps the last token and says so."""

    def __init__(
        self,
        path: Path,
        reread_s: float = TOKEN_REREAD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._reread_s = reread_s
        self._clock = clock
        self._token = self._read()  # a first read that fails is the caller's error
        self._read_at = clock()

    def _read(self) -> str:
        token = self.path.read_text(encoding="utf-8").strip()
        if not token:
            raise ValueError(f"the token file {self.path} is empty")
        return token

    async def authorization(self) -> str | None:
        now = self._clock()
        if now - self._read_at >= self._reread_s:
            self._read_at = now
            try:
                self._token = self._read()
            except (OSError, ValueError) as exc:
                log.warning("cannot read the token file again, keeping the last token: %s", exc)
        return f"Bearer {self._token}"


@dataclass(frozen=True)
class ClientConfig:
    """``server`` is ``https://host:port`` (or ``http://``), with any path
    prefix; ``ssl_context`` is None for ``http://``."""

    server: str
    ssl_context: ssl.SSLContext | None
    credentials: Credentials
    tls_server_name: str | None = None
    proxy: str | None = None


@dataclass(frozen=True)
class Pem:
    """PEM text and the field it came from (for errors)."""

    text: bytes
    field: str


def tls_context(
    ca: Pem | None, cert: Pem | None, key: Pem | None, insecure: bool, where: str
) -> ssl.SSLContext:
    """A client TLS context trusting ``ca`` (else the system's CAs), with
    the client certificate and key if given; ``where`` names the source in
    errors."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if insecure:
        if ca is not None:
            raise ApiError(
                f"{where}: {ca.field} and insecure-skip-tls-verify are both set; "
                "a CA and skipping verification exclude each other"
            )
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca is not None:
        try:
            ctx.load_verify_locations(cadata=ca.text.decode("ascii"))
        except (ssl.SSLError, ValueError) as exc:
            raise ApiError(f"{where}: {ca.field} holds no usable certificate: {exc}") from exc
    if (cert is None) != (key is None):
        given = cert or key
        assert given is not None
        raise ApiError(f"{where}: {given.field} is set without its pair (certificate and key)")
    if cert is not None and key is not None:
        load_pair(ctx, cert, key, where)
    return ctx


def load_pair(ctx: ssl.SSLContext, cert: Pem, key: Pem, where: str) -> None:
    # ssl loads a certificate chain only from files: private temporary ones
    # (mkstemp makes them 0600), removed as soon as they are loaded.
    paths: list[str] = []
    try:
        for pem in (cert, key):
            fd, name = tempfile.mkstemp(prefix="patchbay-kube-", suffix=".pem")
            paths.append(name)
            with os.fdopen(fd, "wb") as f:
                f.write(pem.text)
        ctx.load_cert_chain(paths[0], paths[1])
    except ssl.SSLError as exc:
        raise ApiError(
            f"{where}: {cert.field} and {key.field} are not a usable certificate and key: {exc}"
        ) from exc
    finally:
        for name in paths:
            with contextlib.suppress(OSError):
                Path(name).unlink()
