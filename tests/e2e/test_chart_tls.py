"""The chart serves the fabric API over TLS from one CA (helm template, no
cluster): by default it makes the CA and the fabric's certificate (valid
for the Service's DNS name the controller checks), the fabric serves them,
the controller verifies against the CA; ``tls.secretName`` brings one's
own; ``controller.fabricInsecure`` is plain HTTP on both ends."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chart import by_kind, render

pytestmark = pytest.mark.cluster
BASE = [
    "controller.enabled=true",
    "fabric.enabled=true",
    "fabric.topology.fabrics=null",
]


def _env(docs: list[Any], deployment: str) -> dict[str, str]:
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == deployment]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e.get("value", "")) for e in container.get("env") or []}


def _secrets(docs: list[Any], deployment: str) -> set[str]:
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == deployment]
    vols = dep["spec"]["template"]["spec"]["volumes"]
    return {v["secret"]["secretName"] for v in vols if "secret" in v}


def test_default_is_tls_from_the_charts_own_ca(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE)
    (tls,) = [s for s in by_kind(docs, "Secret") if s.get("type") == "kubernetes.io/tls"]
    assert tls["metadata"]["name"] == "rel-patchbay-tls"
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(tls["data"][key]))
    fabric, ctl = _env(docs, "rel-patchbay-fabric"), _env(docs, "rel-patchbay-controller")
    assert fabric["FABRIC_TLS_CERT"].endswith("/tls.crt") and fabric["FABRIC_INSECURE"] == "false"
    assert ctl["FABRIC_URL"].startswith("https://") and ctl["FABRIC_INSECURE"] == "false"
    assert ctl["FABRIC_CA_BUNDLE"].endswith("/ca.crt")
    assert "rel-patchbay-tls" in _secrets(docs, "rel-patchbay-fabric")
    assert "rel-patchbay-tls" in _secrets(docs, "rel-patchbay-controller")
    # The name the controller checks is one the certificate carries, from that CA.
    name = ctl["FABRIC_SERVER_NAME"]
    assert name == "rel-patchbay-fabric.ns1.svc"
    ok = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname", name,
         str(tmp_path / "tls.crt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    wrong = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname",
         "fabric.example.com", str(tmp_path / "tls.crt")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert wrong.returncode != 0


def test_a_secret_of_ones_own_is_used_by_both_ends(helm: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE, "tls.secretName=corp-ca")
    assert [s for s in by_kind(docs, "Secret") if s.get("type") == "kubernetes.io/tls"] == []
    assert "corp-ca" in _secrets(docs, "rel-patchbay-fabric")
    assert "corp-ca" in _secrets(docs, "rel-patchbay-controller")
    assert _env(docs, "rel-patchbay-controller")["FABRIC_URL"].startswith("https://")


def test_plain_http_only_when_told_on_both_ends(helm: Path) -> None:
    docs = render(helm, "rel", "ns1", None, *BASE, "controller.fabricInsecure=true")
    assert [s for s in by_kind(docs, "Secret") if s.get("type") == "kubernetes.io/tls"] == []
    fabric, ctl = _env(docs, "rel-patchbay-fabric"), _env(docs, "rel-patchbay-controller")
    assert fabric["FABRIC_INSECURE"] == ctl["FABRIC_INSECURE"] == "true"
    assert "FABRIC_TLS_CERT" not in fabric and "FABRIC_CA_BUNDLE" not in ctl
    assert ctl["FABRIC_URL"].startswith("http://")
