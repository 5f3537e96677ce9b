"""Reading what the views need from the API, through :mod:`driver.kube.api`.

Two lists, both cluster-wide: every ResourceSlice and every ResourceClaim
(allocation results are what make a device used, whichever namespace holds
the claim; the pods holding a claim are its ``status.reservedFor``). Lists
are paged with ``limit``/``continue`` as kubectl does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from driver.kube.api import RESOURCE_V1, KubeApi, slice_path

CLAIMS = f"{RESOURCE_V1}/resourceclaims"
PAGE = 500


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


async def list_all(api: KubeApi, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = await api.get(path, {"limit": PAGE, "continue": token})
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            return items


async def snapshot(
    kubeconfig: str | None, context: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(slices, claims)`` as the API returns them."""
    api = await KubeApi.connect(default_kubeconfig(kubeconfig), context)
    try:
        return await list_all(api, slice_path()), await list_all(api, CLAIMS)
    finally:
        await api.close()
