"""Reading what the views need from the API, through :mod:`driver.kube.api`.

Each command asks for the lists it draws (:class:`Wants`): every
ResourceSlice and ResourceClaim (allocation results are what make a device
used, whichever namespace holds the claim; the pods holding a claim are its
``status.reservedFor``), Warning Events (``claims`` in its namespace or all
of them, ``fabric`` all) and Nodes (``fabric``: their fabric reports;
``nodes``: their GPU health annotation).
Lists are paged with ``limit``/``continue`` as kubectl does. The namespace
a command without ``-n``/``-A`` shows is the kubeconfig context's, as in
kubectl (``default`` when the context names none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from driver.kube.api import RESOURCE_V1, KubeApi, slice_path
from driver.kube.kubeconfig import SERVICE_ACCOUNT_DIR

CLAIMS = f"{RESOURCE_V1}/resourceclaims"
PAGE = 500
SERVICE_ACCOUNT_NS = SERVICE_ACCOUNT_DIR / "namespace"
JsonList = list[dict[str, Any]]


@dataclass(frozen=True)
class Wants:
    """The lists one command reads; ``namespace`` None means cluster-wide."""

    events: bool = False
    nodes: bool = False
    namespace: str | None = None


@dataclass
class Snapshot:
    slices: JsonList = field(default_factory=list)
    claims: JsonList = field(default_factory=list)
    events: JsonList = field(default_factory=list)
    nodes: JsonList = field(default_factory=list)


def default_kubeconfig(flag: str | None) -> str | None:
    """kubectl's order: the flag, ``$KUBECONFIG`` (first entry), ``~/.kube/config``;
    None means in-cluster configuration."""
    if flag:
        return flag
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), None)
    if first:
        return first
    home = Path.home() / ".kube" / "config"
    return str(home) if home.is_file() else None


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of ``context`` (or the current one) in the kubeconfig;
    in-cluster, the service account's; ``default`` otherwise."""
    path = default_kubeconfig(kubeconfig)
    if path is None:
        try:
            return SERVICE_ACCOUNT_NS.read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        conf = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "default"
    name = context or conf.get("current-context")
    for c in conf.get("contexts") or ():
        if c.get("name") == name:
            return str((c.get("context") or {}).get("namespace") or "default")
    return "default"


async def list_all(
    api: KubeApi, path: str, query: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = await api.get(path, {**(query or {}), "limit": PAGE, "continue": token})
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            return items


def events_path(namespace: str | None) -> str:
    return "/api/v1/events" if namespace is None else f"/api/v1/namespaces/{namespace}/events"


def claims_path(namespace: str | None) -> str:
    return CLAIMS if namespace is None else f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims"


async def snapshot(kubeconfig: str | None, context: str | None, wants: Wants = Wants()) -> Snapshot:
    """The lists ``wants`` names, as the API returns them (claims and Events of
    ``wants.namespace`` only, when it names one)."""
    api = await KubeApi.connect(default_kubeconfig(kubeconfig), context)
    try:
        claims = await list_all(api, claims_path(wants.namespace))
        snap = Snapshot(await list_all(api, slice_path()), claims)
        if wants.events:
            warnings = {"fieldSelector": "type=Warning"}
            snap.events = await list_all(api, events_path(wants.namespace), warnings)
        if wants.nodes:
            snap.nodes = await list_all(api, "/api/v1/nodes")
        return snap
    finally:
        await api.close()
