"""The controller's webhook endpoint over TLS (driver.controller.process.webhook):
served on loopback with a certificate from a CA the test makes
(tests/harness/cluster_pki), answering an AdmissionReview; a rotated certificate
(its files rewritten, as the kubelet swaps a Secret volume) is served from
the next handshake on, without a restart; a half-written pair is not."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from driver.controller.process.webhook import PATH, WebhookSettings, serve_webhook
from tests.harness.cluster_pki import KeyPair, Pki
from tests.harness.cluster_proc import free_port

pytestmark = pytest.mark.integration
SANS = ("DNS:localhost", "IP:127.0.0.1")


def issue(directory: Path) -> tuple[Path, KeyPair]:
    pki = Pki(directory)
    pki.init()
    return pki.ca.cert, pki.issue("webhook", "patchbay-webhook", server_sans=SANS)


def install(pair: KeyPair, cert: Path, key: Path) -> None:
    """Replace the served files atomically, each by a rename (a new inode)."""
    for src, dst in ((pair.cert, cert), (pair.key, key)):
        shutil.copy(src, dst.with_suffix(".new"))
        dst.with_suffix(".new").replace(dst)


def post(port: int, ca: Path, body: Any, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """POST to the webhook. By IP the client sends no SNI (the apiserver to a
    URL with an IP); by name it does (the apiserver to the chart's Service)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    req = urllib.request.Request(
        f"https://{host}:{port}{PATH}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


REVIEW = {
    "request": {
        "uid": "u-1",
        "kind": {"group": "resource.k8s.io", "kind": "ResourceClaim"},
        "operation": "CREATE",
        "namespace": "ns",
        "object": {
            "metadata": {"name": "c"},
            "spec": {
                "devices": {
                    "config": [
                        {
                            "opaque": {
                                "driver": "patchbay.dev",
                                "parameters": {
                                    "apiVersion": "patchbay.dev/v1alpha1",
                                    "kind": "GpuConfig",
                                    "typo": 1,
                                },
                            }
                        }
                    ]
                }
            },
        },
    }
}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[int, Path, Path, Path]]:
    ca, pair = issue(tmp_path / "first")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    install(pair, cert, key)
    port = free_port()
    settings = WebhookSettings(webhook_port=port, webhook_tls_cert=cert, webhook_tls_key=key)
    task = asyncio.create_task(serve_webhook(settings, host="127.0.0.1"))
    for _ in range(100):
        try:
            await asyncio.to_thread(post, port, ca, {})
            break
        except OSError:
            await asyncio.sleep(0.05)
    yield port, ca, cert, key
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_admission_review_is_answered_over_tls(
    served: tuple[int, Path, Path, Path],
) -> None:
    port, ca, _, _ = served
    status, raw = await asyncio.to_thread(post, port, ca, REVIEW)
    assert status == 200
    response = json.loads(raw)["response"]
    assert response["uid"] == "u-1" and response["allowed"] is False
    assert "field typo: Extra inputs are not permitted" in response["status"]["message"]
    status, raw = await asyncio.to_thread(post, port, ca, {"kind": "AdmissionReview"})
    assert status == 400 and b"not an AdmissionReview" in raw


async def test_a_rotated_certificate_is_served_without_a_restart(
    served: tuple[int, Path, Path, Path], tmp_path: Path
) -> None:
    port, first_ca, cert, key = served
    second_ca, second = issue(tmp_path / "second")
    with pytest.raises(urllib.error.URLError, match="certificate verify failed"):
        await asyncio.to_thread(post, port, second_ca, REVIEW)
    install(second, cert, key)
    for host in ("127.0.0.1", "localhost"):  # without SNI and with it
        status, _ = await asyncio.to_thread(post, port, second_ca, REVIEW, host)
        assert status == 200, host
    with pytest.raises(urllib.error.URLError, match="certificate verify failed"):
        await asyncio.to_thread(post, port, first_ca, REVIEW)
    # Half a rotation (a key that is not the certificate's): the last good pair stays.
    _, third = issue(tmp_path / "third")
    install(KeyPair(cert, third.key), cert, key)
    status, _ = await asyncio.to_thread(post, port, second_ca, REVIEW)
    assert status == 200
