"""A kubeconfig's ``exec`` credential plugin (driver/kube/execcred.py), run
as a real subprocess: a script of ours that records how it was called
(arguments, environment, ``KUBERNETES_EXEC_INFO``) and prints the
ExecCredential the test gives it. The answer is kept until it expires,
a client certificate it returns gets through a TLS server that demands
one, and every fault names the kubeconfig field."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from driver.errors import ApiError
from driver.kube.kubeconfig import load_kubeconfig
from tests.unit.kube_tls import SERVER_NAME, handshake, make_certs, tls_server

V1 = "client.authentication.k8s.io/v1"
PLUGIN = f"""#!{sys.executable}
import json, os, pathlib, sys
here = pathlib.Path(__file__).parent
calls = here / "calls.jsonl"
with calls.open("a") as f:
    f.write(json.dumps({{"args": sys.argv[1:], "env": os.environ.get("FROM_KUBECONFIG"),
                        "info": json.loads(os.environ["KUBERNETES_EXEC_INFO"])}}) + "\\n")
answer = here / "answer"
if not answer.exists():
    sys.exit("no answer for you")
sys.stdout.write(answer.read_text())
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """``bin/plugin`` under tmp_path (a relative command in the kubeconfig)."""
    (tmp_path / "bin").mkdir()
    path = tmp_path / "bin" / "plugin"
    path.write_text(PLUGIN)
    path.chmod(0o755)
    return path


def answer(plugin: Path, status: dict[str, Any], version: str = V1) -> None:
    doc = {"apiVersion": version, "kind": "ExecCredential", "status": status}
    (plugin.parent / "answer").write_text(json.dumps(doc))


def not_executable(plugin: Path) -> None:
    plugin.chmod(0o644)


def calls(plugin: Path) -> list[dict[str, Any]]:
    path = plugin.parent / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kubeconfig(tmp_path: Path, server: str, **exec_: Any) -> Path:
    spec = {"apiVersion": V1, "command": "./bin/plugin", **exec_}
    cluster = {"server": server, "tls-server-name": SERVER_NAME}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"exec": spec}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return path


async def test_the_token_is_asked_once_and_kept(tmp_path: Path, plugin: Path) -> None:
    answer(plugin, {"token": "t1", "expirationTimestamp": "2999-01-01T00:00:00Z"})
    path = kubeconfig(
        tmp_path, "https://k:6443", args=["get-token", "--x"], provideClusterInfo=True,
        env=[{"name": "FROM_KUBECONFIG", "value": "yes"}],
    )  # fmt: skip
    creds = load_kubeconfig(path).credentials
    assert calls(plugin) == []  # not at load: at the first request
    assert await creds.authorization() == "Bearer t1"
    answer(plugin, {"token": "t2"})
    assert await creds.authorization() == "Bearer t1"
    (call,) = calls(plugin)
    assert call["args"] == ["get-token", "--x"] and call["env"] == "yes"
    assert call["info"] == {
        "apiVersion": V1,
        "kind": "ExecCredential",
        "spec": {
            "interactive": False,
            "cluster": {"server": "https://k:6443", "tls-server-name": SERVER_NAME},
        },
    }


async def test_an_expired_answer_runs_the_plugin_again(tmp_path: Path, plugin: Path) -> None:
    answer(plugin, {"token": "old", "expirationTimestamp": "2000-01-01T00:00:00Z"}, V1 + "beta1")
    creds = load_kubeconfig(kubeconfig(tmp_path, "https://k", apiVersion=V1 + "beta1")).credentials
    assert await creds.authorization() == "Bearer old"
    answer(plugin, {"token": "new"}, V1 + "beta1")
    both = await asyncio.gather(creds.authorization(), creds.authorization())
    assert list(both) == ["Bearer new"] * 2
    assert len(calls(plugin)) == 2  # concurrent callers share one run
    assert "cluster" not in calls(plugin)[0]["info"]["spec"]


async def test_a_client_certificate_from_the_plugin_gets_through_tls(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, plugin: Path
) -> None:
    certs = make_certs(tmp_path_factory.mktemp("pki"))
    answer(plugin, {
        "clientCertificateData": certs.client.cert.read_text(),
        "clientKeyData": certs.client.key.read_text(),
    })  # fmt: skip
    async with tls_server(certs) as port:
        path = kubeconfig(tmp_path, f"https://127.0.0.1:{port}")
        doc = json.loads(path.read_text())
        ca = base64.b64encode(certs.ca.read_bytes()).decode()
        doc["clusters"][0]["cluster"]["certificate-authority-data"] = ca
        path.write_text(json.dumps(doc))
        config = load_kubeconfig(path)
        assert await config.credentials.authorization() is None  # no header: the certificate
        assert await handshake(config, port) == b"hello"


async def failure(tmp_path: Path, plugin: Path) -> str:
    creds = load_kubeconfig(kubeconfig(tmp_path, "http://k")).credentials
    with pytest.raises(ApiError) as info:
        await creds.authorization()
    return str(info.value)


async def test_plugin_faults_name_the_field(tmp_path: Path, plugin: Path) -> None:
    assert "failed: no answer for you" in await failure(tmp_path, plugin)
    (plugin.parent / "answer").write_text("not json")
    assert "printed no ExecCredential" in await failure(tmp_path, plugin)
    answer(plugin, {"token": "t"}, "client.authentication.k8s.io/v9")
    assert "answered another apiVersion" in await failure(tmp_path, plugin)
    answer(plugin, {})
    assert "neither token nor clientCertificateData" in await failure(tmp_path, plugin)
    answer(plugin, {"clientCertificateData": "x", "clientKeyData": "y"})
    assert "needs an https:// server" in await failure(tmp_path, plugin)
    answer(plugin, {"token": "t", "expirationTimestamp": "soon"})
    assert "expirationTimestamp is not RFC 3339" in await failure(tmp_path, plugin)
    (plugin.parent / "answer").write_text("")
    answer(plugin, {"token": "t"})
    not_executable(plugin)
    said = await failure(tmp_path, plugin)
    assert f"kubeconfig {tmp_path / 'kubeconfig'}" in said and "did not run" in said


@pytest.mark.parametrize(
    ("exec_", "error"),
    [
        ({"command": ""}, r"exec\.command must be set"),
        ({"apiVersion": "v1"}, r"exec\.apiVersion must be one of"),
        ({"interactiveMode": "Always"}, r"exec\.interactiveMode Always is not supported"),
        ({"args": "--x"}, r"exec\.args must be a list"),
        ({"env": [{"value": "v"}]}, r"exec\.env\[0\] must have a name"),
    ],
)
def test_a_bad_exec_spec_names_the_field(tmp_path: Path, exec_: dict[str, Any], error: str) -> None:
    with pytest.raises(ApiError, match=rf"kubeconfig .*users\[name=u\]\.user\.{error}"):
        load_kubeconfig(kubeconfig(tmp_path, "https://k", **exec_))
