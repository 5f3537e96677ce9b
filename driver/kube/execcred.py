"""Credentials from a kubeconfig's ``exec`` plugin (client.authentication.k8s.io).

Why this module exists: the kubeconfigs of managed clusters (EKS's
``aws eks get-token``, GKE's ``gke-gcloud-auth-plugin``, kubelogin) get
their credentials by running a command; ``kubectl patchbay`` on a
workstation meets them (the plugin and controller run in-cluster and
never do). :class:`ExecCredentials` runs the command as client-go does:
``args`` and ``env`` added, ``KUBERNETES_EXEC_INFO`` set to an
``ExecCredential`` request (``spec.interactive`` false: we never hand the
command a terminal, so ``interactiveMode: Always`` is refused), and reads
the ``ExecCredential`` it prints: a ``status.token``, or a client
certificate and key (``clientCertificateData``/``clientKeyData``, loaded
into the TLS context of new connections). The answer is kept until its
``expirationTimestamp`` (none: for the process's life), then the command
runs again. Versions v1 and v1beta1 are read alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from driver.errors import ApiError
from driver.kube.clientconfig import Credentials, Pem, load_pair

log = logging.getLogger(__name__)

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_S = 60.0  # a plugin may ask a cloud's token service; it gets a minute


@dataclass(frozen=True)
class ExecSpec:
    """A kubeconfig's ``users[].user.exec``, checked (``where`` names it)."""

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    api_version: str
    cluster: Mapping[str, Any] | None  # sent when provideClusterInfo is true
    where: str


def exec_spec(
    raw: Mapping[str, Any],
    where: str,
    resolve: Callable[[str], Path],
    cluster: Mapping[str, Any],
) -> ExecSpec:
    """The ``exec`` mapping ``raw`` checked; ``resolve`` turns a relative
    command with a path separator into a path (against the kubeconfig's
    directory, as client-go does)."""

    def fail(message: str) -> ApiError:
        return ApiError(f"{where}.{message}")

    command = raw.get("command")
    if not isinstance(command, str) or not command:
        raise fail("command must be set (the credential plugin to run)")
    version = raw.get("apiVersion")
    if version not in API_VERSIONS:
        raise fail(f"apiVersion must be one of {', '.join(API_VERSIONS)}, not {version!r}")
    if raw.get("interactiveMode") == "Always":
        raise fail("interactiveMode Always is not supported: the command gets no terminal")
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise fail("args must be a list of strings")
    env: list[tuple[str, str]] = []
    for i, item in enumerate(raw.get("env") or []):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise fail(f"env[{i}] must have a name and a value")
        env.append((item["name"], str(item.get("value", ""))))
    if os.sep in command and not Path(command).is_absolute():
        command = str(resolve(command))
    info = dict(cluster) if raw.get("provideClusterInfo") else None
    return ExecSpec(command, tuple(args), tuple(env), version, info, where)


class ExecCredentials(Credentials):
    """What the plugin answers, kept until it expires (monotonic clock)."""

    def __init__(self, spec: ExecSpec, ssl_context: ssl.SSLContext | None) -> None:
        self.spec = spec
        self._ssl = ssl_context
        self._header: str | None = None
        self._until: float | None = None  # monotonic; None: never expires
        self._fetched = False
        self._lock = asyncio.Lock()

    def _fresh(self) -> bool:
        return self._fetched and (self._until is None or time.monotonic() < self._until)

    async def authorization(self) -> str | None:
        if not self._fresh():
            async with self._lock:
                if not self._fresh():
                    self._take(await self._run())
        return self._header

    async def _run(self) -> Mapping[str, Any]:
        spec = self.spec
        request: dict[str, Any] = {
            "apiVersion": spec.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        if spec.cluster is not None:
            request["spec"]["cluster"] = spec.cluster
        env = {**os.environ, **dict(spec.env), "KUBERNETES_EXEC_INFO": json.dumps(request)}
        try:
            proc = await asyncio.create_subprocess_exec(
                spec.command,
                *spec.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(EXEC_TIMEOUT_S):
                out, err = await proc.communicate()
        except (OSError, TimeoutError) as exc:
            raise ApiError(f"{spec.where}.command {spec.command!r} did not run: {exc}") from exc
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip()[-500:]
            raise ApiError(f"{spec.where}.command {spec.command!r} failed: {said}")
        try:
            answer = json.loads(out)
        except ValueError as exc:
            raise ApiError(f"{spec.where}.command printed no ExecCredential: {exc}") from exc
        if not isinstance(answer, Mapping) or answer.get("apiVersion") != spec.api_version:
            raise ApiError(
                f"{spec.where}.command answered another apiVersion than {spec.api_version}"
            )
        status = answer.get("status")
        if not isinstance(status, Mapping):
            raise ApiError(f"{spec.where}.command's ExecCredential has no status")
        return status

    def _take(self, status: Mapping[str, Any]) -> None:
        where = f"{self.spec.where}.command's ExecCredential status"
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        has_token = isinstance(token, str) and bool(token)
        has_pair = isinstance(cert, str) and isinstance(key, str) and bool(cert and key)
        if not has_token and not has_pair:
            raise ApiError(f"{where}: neither token nor clientCertificateData/clientKeyData")
        if has_pair:
            if self._ssl is None:
                raise ApiError(f"{where}: a client certificate needs an https:// server")
            assert isinstance(cert, str) and isinstance(key, str)
            pair = (Pem(cert.encode(), f"{where}.clientCertificateData"),
                    Pem(key.encode(), f"{where}.clientKeyData"))  # fmt: skip
            load_pair(self._ssl, *pair, where)
        self._header = f"Bearer {token}" if has_token else None
        self._until = None
        expiry = status.get("expirationTimestamp")
        if expiry:
            try:
                at = datetime.fromisoformat(str(expiry).replace("Z", "+00:00")).timestamp()
            except ValueError as exc:
                raise ApiError(f"{where}.expirationTimestamp is not RFC 3339: {exc}") from exc
            self._until = time.monotonic() + (at - time.time())
        self._fetched = True
        log.debug("exec credential plugin %s answered", self.spec.command)
