"""A cluster CA and a TLS server that demands a client certificate, for the
Kubernetes client's configuration tests (kubeconfig, exec credentials).

Why this module exists: whether a CA, a client certificate and a server
name were loaded into a TLS context shows only in a handshake; this is the
other end of it, on a local socket, with certificates from the harness's
own openssl-based CA (tests/harness/cluster_pki.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from driver.kube.clientconfig import ClientConfig
from tests.harness.cluster_pki import KeyPair, Pki

SERVER_NAME = "apiserver.test"  # the server certificate's only name


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: KeyPair
    client: KeyPair


def make_certs(directory: Path) -> Certs:
    pki = Pki(directory)
    pki.init()
    server = pki.issue("server", "apiserver", server_sans=(f"DNS:{SERVER_NAME}",))
    return Certs(pki.ca.cert, server, pki.issue("client", "someone"))


@contextlib.asynccontextmanager
async def tls_server(certs: Certs) -> AsyncIterator[int]:
    """The port of a TLS server on 127.0.0.1 that requires a client
    certificate from the CA and writes ``hello`` after the handshake."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
    ctx.load_cert_chain(certs.server.cert, certs.server.key)
    ctx.verify_mode = ssl.CERT_REQUIRED

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    try:
        yield listener.sockets[0].getsockname()[1]
    finally:
        listener.close()
        await listener.wait_closed()


async def handshake(config: ClientConfig, port: int) -> bytes:
    """What the server wrote, once ``config``'s TLS context got through."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=config.ssl_context, server_hostname=config.tls_server_name
    )
    try:
        return await reader.read()
    finally:
        writer.close()
