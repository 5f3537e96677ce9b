"""The fabric API over TLS, between the real ``patchbay-fabric`` process and
the controller's client: the certificate is verified against the launcher's
CA (tests/harness/fabricsim, tests/harness/cluster_pki), a wrong CA or host name is refused
with an error that says so, a rotated token file is used by both ends
without a restart. (Plain HTTP only with the explicit insecure setting:
tests/unit/test_fabric_tls_settings.py.)"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.errors import FabricApiError, FabricTlsError, FabricUnavailable
from driver.fabricclient import FabricClient
from driver.fabricclient.token import TokenSource
from tests.harness.cluster_pki import Pki
from tests.harness.fabricsim import FabricService, switch

pytestmark = pytest.mark.integration
SPEC = {"switches": [switch("sw0", [("node-a", "adapter0", Path("/nonexistent"))], ["gpu-0"])]}


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FabricService]:
    svc = FabricService(tmp_path_factory.mktemp("fabric-tls"), SPEC, token="first")
    svc.start()
    yield svc
    svc.stop()


def _ctx(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def _ids(client: FabricClient) -> list[str]:
    async with client:
        return [d.id for d in await client.devices()]


async def test_the_launchers_ca_verifies_the_fabric(fabric: FabricService) -> None:
    assert fabric.url.startswith("https://")
    assert await _ids(FabricClient(fabric.url, "first", tls=_ctx(fabric.ca_bundle))) == ["gpu-0"]
    # The host name checked can differ from the URL's host (the chart dials an IP).
    named = FabricClient(fabric.url, "first", tls=_ctx(fabric.ca_bundle), server_name="localhost")
    assert await _ids(named) == ["gpu-0"]


async def test_a_wrong_ca_is_refused_clearly(fabric: FabricService, tmp_path: Path) -> None:
    other = Pki(tmp_path / "other")
    other.init()
    with pytest.raises(FabricTlsError, match="TLS certificate was refused") as info:
        await _ids(FabricClient(fabric.url, "first", tls=_ctx(other.ca.cert)))
    print(info.value)
    assert "certificate verify failed" in str(info.value)


async def test_a_wrong_host_name_is_refused_clearly(fabric: FabricService) -> None:
    client = FabricClient(
        fabric.url, "first", tls=_ctx(fabric.ca_bundle), server_name="fabric.example.com"
    )
    with pytest.raises(FabricTlsError, match=r"fabric\.example\.com") as info:
        await _ids(client)
    print(info.value)
    assert "mismatch" in str(info.value).lower()


async def test_plain_http_to_the_tls_port_fails(fabric: FabricService) -> None:
    with pytest.raises(FabricUnavailable):
        await _ids(FabricClient(fabric.url.replace("https://", "http://"), "first"))


async def test_token_rotation_without_restart(fabric: FabricService) -> None:
    rotating = FabricClient(
        fabric.url, TokenSource(path=fabric.token_file), tls=_ctx(fabric.ca_bundle)
    )
    stale = FabricClient(fabric.url, "first", tls=_ctx(fabric.ca_bundle))
    async with rotating, stale:
        assert [d.id for d in await rotating.devices()] == ["gpu-0"]
        fabric.rotate_token("second")
        try:
            # The same processes, the same session: the new token both ends.
            assert [d.id for d in await rotating.devices()] == ["gpu-0"]
            with pytest.raises(FabricApiError) as info:
                await stale.devices()
            assert info.value.status == 401
        finally:
            fabric.rotate_token("first")
