"""Our kubeconfig and in-cluster loading (driver/kube/kubeconfig.py, issue 36):
every field we read, relative paths against the file's directory, bad input
refused with the file and the field named, and the in-cluster token re-read
on its period (bound tokens rotate).

TLS fields are proven by a handshake with a local TLS server that requires a
client certificate: the CA and the client pair must have been loaded for it
to answer."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from driver.errors import ApiError
from driver.kube.clientconfig import ClientConfig, TokenFile
from driver.kube.kubeconfig import load_incluster, load_kubeconfig
from tests.unit.kube_tls import Certs, handshake, make_certs, tls_server


def write(path: Path, user: dict[str, Any], cluster: dict[str, Any], **top: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "x", "context": {"cluster": "c", "user": "u"}},
            {"name": "anon", "context": {"cluster": "c"}},
        ],
        "current-context": "x",
        **top,
    }
    path.write_text(json.dumps(doc))
    return path


async def auth(config: ClientConfig) -> str | None:
    return await config.credentials.authorization()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def tls_port(certs: Certs) -> AsyncIterator[int]:
    async with tls_server(certs) as port:
        yield port


async def test_files_relative_to_the_kubeconfig_make_a_working_client_tls(
    tmp_path: Path, certs: Certs, tls_port: int
) -> None:
    ca, client = certs.ca, certs.client
    (tmp_path / "certs").mkdir()
    for name, src in (("ca.crt", ca), ("c.crt", client.cert), ("c.key", client.key)):
        (tmp_path / "certs" / name).write_bytes(src.read_bytes())
    user = {"client-certificate": "certs/c.crt", "client-key": "certs/c.key"}
    cluster = {
        "server": f"https://127.0.0.1:{tls_port}/",
        "certificate-authority": "certs/ca.crt",
        "tls-server-name": "apiserver.test",
    }
    config = load_kubeconfig(write(tmp_path / "kubeconfig", user, cluster))
    assert config.server == f"https://127.0.0.1:{tls_port}"
    assert config.tls_server_name == "apiserver.test" and config.proxy is None
    assert await auth(config) is None
    assert await handshake(config, tls_port) == b"hello"


async def test_inline_data_and_the_server_name(tmp_path: Path, certs: Certs, tls_port: int) -> None:
    ca, client = certs.ca, certs.client

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    user = {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)}
    cluster = {
        "server": f"https://127.0.0.1:{tls_port}",
        "certificate-authority-data": b64(ca),
    }
    config = load_kubeconfig(
        write(tmp_path / "k", user, {**cluster, "tls-server-name": "apiserver.test"})
    )
    assert await handshake(config, tls_port) == b"hello"
    # without tls-server-name the certificate (apiserver.test) does not match 127.0.0.1
    config = load_kubeconfig(write(tmp_path / "k", user, cluster))
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(config, tls_port)


async def test_insecure_skip_tls_verify_trusts_any_server(
    tmp_path: Path, certs: Certs, tls_port: int
) -> None:
    client = certs.client
    user = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    cluster = {"server": f"https://127.0.0.1:{tls_port}", "insecure-skip-tls-verify": True}
    config = load_kubeconfig(write(tmp_path / "k", user, cluster))
    assert await handshake(config, tls_port) == b"hello"


async def test_tokens_basic_auth_proxy_and_named_contexts(tmp_path: Path) -> None:
    cluster = {"server": "http://127.0.0.1:1", "proxy-url": "http://proxy:3128"}
    path = write(tmp_path / "k", {"token": "abc"}, cluster)
    config = load_kubeconfig(path)
    assert config.ssl_context is None and config.proxy == "http://proxy:3128"
    assert await auth(config) == "Bearer abc"
    assert await auth(load_kubeconfig(path, "anon")) is None
    (tmp_path / "tok").write_text("from-file\n")
    # tokenFile wins over token, as in client-go; relative to the file
    path = write(tmp_path / "k", {"token": "abc", "tokenFile": "tok"}, cluster)
    assert await auth(load_kubeconfig(path)) == "Bearer from-file"
    path = write(tmp_path / "k", {"username": "ann", "password": "pw"}, cluster)
    assert await auth(load_kubeconfig(path)) == "Basic " + base64.b64encode(b"ann:pw").decode()


async def test_the_token_file_is_read_again_after_its_period(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    now = [100.0]
    creds = TokenFile(token, reread_s=60.0, clock=lambda: now[0])
    token.write_text("two")
    now[0] = 159.0
    assert await creds.authorization() == "Bearer one"
    now[0] = 160.0
    assert await creds.authorization() == "Bearer two"
    token.unlink()  # a failed read keeps the last token
    now[0] = 300.0
    assert await creds.authorization() == "Bearer two"


async def test_in_cluster_reads_the_service_account(tmp_path: Path, certs: Certs) -> None:
    ca = certs.ca
    (tmp_path / "ca.crt").write_bytes(ca.read_bytes())
    (tmp_path / "token").write_text("sa-token\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_incluster(env, tmp_path)
    assert config.server == "https://10.96.0.1:443"
    assert config.ssl_context is not None and config.ssl_context.get_ca_certs()
    assert isinstance(config.credentials, TokenFile)
    assert config.credentials.path == tmp_path / "token"
    assert await auth(config) == "Bearer sa-token"
    env6 = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert load_incluster(env6, tmp_path).server == "https://[fd00::1]:6443"


def test_in_cluster_errors_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"):
        load_incluster({}, tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}
    with pytest.raises(ApiError, match=r"ca\.crt"):
        load_incluster(env, tmp_path)


S = {"server": "https://x"}
JUNK_CA = {**S, "certificate-authority-data": base64.b64encode(b"junk").decode()}
U = r"users\[name=u\]\.user"
C = r"clusters\[name=c\]\.cluster"
BAD = [
    ({}, {"server": "ftp://x"}, {}, rf"{C}\.server must be an https://"),
    ({}, {"server": 5}, {}, rf"{C}\.server must be a string"),
    ({"auth-provider": {"name": "oidc"}}, S, {}, rf"{U}\.auth-provider is not supported"),
    ({"client-key-data": "!!"}, S, {}, rf"{U}\.client-key-data is not base64"),
    ({"client-certificate": "no.crt"}, S, {}, rf"{U}\.client-certificate: cannot read .*no\.crt"),
    ({"username": "ann"}, S, {}, rf"{U}\.username and \.password go together"),
    ({"tokenFile": "nope"}, S, {}, rf"{U}\.tokenFile: .*nope"),
    ({}, {**S, "insecure-skip-tls-verify": "yes"}, {}, rf"{C}\.insecure-skip-tls-verify must be"),
    ({}, JUNK_CA, {}, rf"{C}\.certificate-authority-data holds no usable certificate"),
    ({}, S, {"current-context": "gone"}, r"contexts has no entry named 'gone'"),
    ({}, S, {"current-context": None}, r"current-context is not set"),
    ({}, S, {"clusters": {"c": 1}}, r"clusters must be a list"),
]


@pytest.mark.parametrize(("user", "cluster", "top", "error"), BAD)
def test_bad_input_names_the_file_and_the_field(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], top: dict[str, Any], error: str
) -> None:
    path = write(tmp_path / "kubeconfig", user, cluster, **top)
    with pytest.raises(ApiError, match=error) as info:
        load_kubeconfig(path)
    assert f"kubeconfig {path}" in str(info.value)


def test_a_key_without_its_certificate_and_an_unreadable_file(tmp_path: Path, certs: Certs) -> None:
    client = certs.client
    path = write(tmp_path / "k", {"client-key": str(client.key)}, {"server": "https://x"})
    with pytest.raises(ApiError, match=r"user\.client-key is set without its pair"):
        load_kubeconfig(path)
    with pytest.raises(ApiError, match=r"kubeconfig .*absent: cannot read it"):
        load_kubeconfig(tmp_path / "absent")
    (tmp_path / "bad").write_text("a: [")
    with pytest.raises(ApiError, match="not YAML"):
        load_kubeconfig(tmp_path / "bad")


def test_yaml_as_kubectl_writes_it(tmp_path: Path) -> None:
    (tmp_path / "k").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:8080\n"
        "users:\n- name: u\n  user:\n    token: yaml-token\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u}\n"
    )
    assert load_kubeconfig(tmp_path / "k").server == "http://127.0.0.1:8080"
