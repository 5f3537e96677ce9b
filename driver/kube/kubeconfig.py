"""Reads a kubeconfig file, or the in-cluster files, into a :class:`ClientConfig`.

Why this module exists: the ``kubernetes`` package's loader brought its
whole client with it (and aiohttp), megabytes of every plugin's memory for
a few dozen lines of parsing (issue 36). This reads what our processes and
``kubectl patchbay`` meet: a context (named, or ``current-context``); the
cluster's ``server``, ``certificate-authority(-data)``,
``insecure-skip-tls-verify``, ``tls-server-name`` and ``proxy-url``; the
user's ``client-certificate(-data)`` + ``client-key(-data)``, ``token``,
``tokenFile`` (re-read, and taking precedence over ``token`` as in
client-go), ``username``/``password``, or an ``exec`` credential plugin
(:mod:`driver.kube.execcred`, for ``kubectl patchbay`` on managed
clusters). Relative file paths resolve against the kubeconfig's
directory, as kubectl does. ``auth-provider`` (removed from kubectl) is
refused with an error naming the field.

In-cluster: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's
``ca.crt``, and its ``token`` re-read every minute (bound tokens rotate).
Every error is an :class:`ApiError` naming the file and the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from driver.errors import ApiError
from driver.kube.clientconfig import (
    ClientConfig,
    Credentials,
    Pem,
    TokenFile,
    basic,
    bearer,
    tls_context,
)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
UNSUPPORTED_USER_FIELDS = ("auth-provider",)


def load_kubeconfig(path: str | Path, context: str | None = None) -> ClientConfig:
    """The configuration of ``context`` (else ``current-context``) in ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ApiError(f"kubeconfig {path}: cannot read it: {exc}") from exc
    return _Reader(path, _parse(text, path)).config(context)


def _parse(text: str, path: Path) -> object:
    # JSON is YAML, and what our harnesses write: json is loaded already,
    # PyYAML costs 1.6 MB resident and 25 ms (imported only when needed).
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML's flow style, or broken: YAML says which
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where built with it
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise ApiError(f"kubeconfig {path}: not YAML: {exc}") from exc


class _Reader:
    def __init__(self, path: Path, doc: object) -> None:
        self.path = path
        self.base = path.parent
        self.doc = self.mapping(doc, "the document")

    def fail(self, message: str) -> ApiError:
        return ApiError(f"kubeconfig {self.path}: {message}")

    def mapping(self, value: object, where: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(f"{where} must be a mapping, not {type(value).__name__}")
        return value

    def text(self, obj: Mapping[str, Any], key: str, where: str) -> str | None:
        value = obj.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise self.fail(f"{where}.{key} must be a string, not {type(value).__name__}")
        return value

    def named(self, kind: str, name: str, field: str) -> Mapping[str, Any]:
        """The ``field`` of the entry called ``name`` in the list ``kind``."""
        entries = self.doc.get(kind) or []
        if not isinstance(entries, list):
            raise self.fail(f"{kind} must be a list")
        for entry in entries:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                return self.mapping(entry.get(field), f"{kind}[name={name}].{field}")
        raise self.fail(f"{kind} has no entry named {name!r}")

    def config(self, context: str | None) -> ClientConfig:
        name = context or self.text(self.doc, "current-context", "the document")
        if name is None:
            raise self.fail("current-context is not set and no context was named")
        ctx = self.named("contexts", name, "context")
        where = f"contexts[name={name}].context"
        cluster_name = self.text(ctx, "cluster", where)
        if cluster_name is None:
            raise self.fail(f"{where}.cluster is not set")
        cluster = self.named("clusters", cluster_name, "cluster")
        user_name = self.text(ctx, "user", where)
        user = self.named("users", user_name, "user") if user_name else {}
        return self.client(cluster, f"clusters[name={cluster_name}].cluster", user, user_name)

    def client(
        self,
        cluster: Mapping[str, Any],
        cwhere: str,
        user: Mapping[str, Any],
        user_name: str | None,
    ) -> ClientConfig:
        uwhere = f"users[name={user_name}].user"
        for field in UNSUPPORTED_USER_FIELDS:
            if user.get(field):
                raise self.fail(f"{uwhere}.{field} is not supported (use exec or a token)")
        server = self.text(cluster, "server", cwhere)
        url = urlsplit(server) if server is not None else None
        if server is None or url is None or not url.hostname or url.scheme not in ("https", "http"):
            raise self.fail(f"{cwhere}.server must be an https:// or http:// URL, not {server!r}")
        insecure = cluster.get("insecure-skip-tls-verify", False)
        if not isinstance(insecure, bool):
            raise self.fail(f"{cwhere}.insecure-skip-tls-verify must be true or false")
        ca = self.pem(cluster, "certificate-authority", cwhere)
        cert = self.pem(user, "client-certificate", uwhere)
        key = self.pem(user, "client-key", uwhere)
        ssl_context = None
        if server.startswith("https://"):
            ssl_context = tls_context(ca, cert, key, insecure, f"kubeconfig {self.path}")
        credentials = self.credentials(user, uwhere)
        exec_ = user.get("exec")
        if exec_:
            from driver.kube.execcred import ExecCredentials, exec_spec  # kubectl patchbay's case

            where = f"kubeconfig {self.path}: {uwhere}.exec"
            raw = self.mapping(exec_, f"{uwhere}.exec")
            info = exec_cluster_info(server, cluster, ca)
            credentials = ExecCredentials(exec_spec(raw, where, self.file, info), ssl_context)
        return ClientConfig(
            server=server.rstrip("/"),
            ssl_context=ssl_context,
            credentials=credentials,
            tls_server_name=self.text(cluster, "tls-server-name", cwhere),
            proxy=self.text(cluster, "proxy-url", cwhere),
        )

    def file(self, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base / path

    def pem(self, obj: Mapping[str, Any], key: str, where: str) -> Pem | None:
        """``key`` (a file) or ``key-data`` (base64) of ``obj``; data wins, as in client-go."""
        data = self.text(obj, f"{key}-data", where)
        if data is not None:
            try:
                return Pem(base64.b64decode(data, validate=True), f"{where}.{key}-data")
            except (binascii.Error, ValueError) as exc:
                raise self.fail(f"{where}.{key}-data is not base64: {exc}") from exc
        name = self.text(obj, key, where)
        if name is None:
            return None
        try:
            return Pem(self.file(name).read_bytes(), f"{where}.{key}")
        except OSError as exc:
            raise self.fail(f"{where}.{key}: cannot read {self.file(name)}: {exc}") from exc

    def credentials(self, user: Mapping[str, Any], where: str) -> Credentials:
        token_file = self.text(user, "tokenFile", where)
        if token_file is not None:
            try:
                return TokenFile(self.file(token_file))
            except (OSError, ValueError) as exc:
                raise self.fail(f"{where}.tokenFile: {exc}") from exc
        token = self.text(user, "token", where)
        if token is not None:
            return bearer(token)
        username = self.text(user, "username", where)
        password = self.text(user, "password", where)
        if (username is None) != (password is None):
            raise self.fail(f"{where}.username and .password go together; one is missing")
        if username is not None and password is not None:
            return basic(username, password)
        return Credentials()


def exec_cluster_info(server: str, cluster: Mapping[str, Any], ca: Pem | None) -> dict[str, Any]:
    """``spec.cluster`` of an ExecCredential request (``provideClusterInfo``):
    client-go's fields, the CA as base64 data, the plugin's own extension."""
    info: dict[str, Any] = {"server": server}
    for key in ("tls-server-name", "insecure-skip-tls-verify", "proxy-url"):
        if cluster.get(key):
            info[key] = cluster[key]
    if ca is not None:
        info["certificate-authority-data"] = base64.b64encode(ca.text).decode()
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, Mapping) and ext.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = ext.get("extension")
    return info


def load_incluster(
    env: Mapping[str, str] = os.environ, root: Path = SERVICE_ACCOUNT_DIR
) -> ClientConfig:
    """The configuration a pod gets: the service's address from ``env``,
    the service account's CA and token from ``root``."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ApiError(
            "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"
            " (or give a kubeconfig)"
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    where = f"in-cluster {root}"
    ca_path = root / "ca.crt"
    try:
        ca = Pem(ca_path.read_bytes(), str(ca_path))
        credentials = TokenFile(root / "token")
    except (OSError, ValueError) as exc:
        raise ApiError(f"{where}: {exc}") from exc
    return ClientConfig(
        server=f"https://{host}:{port}",
        ssl_context=tls_context(ca, None, None, False, where),
        credentials=credentials,
    )
