"""Claims pairing a GPU with a VF on one PCIe root, as the e2e tests write
and read them: the roots of the simulated node, the template and request
bodies, what a claim got and where it is.

Why: the pairing e2e tests and the ``kubectl patchbay`` topology test
claim pairs the same way."""

from __future__ import annotations

from typing import Any

from kubernetes import client

ROOT = "resource.kubernetes.io/pcieRoot"
ROOT_A, ROOT_B = "pci0000:15", "pci0000:85"


def devices(resource_api: client.ResourceV1Api, node: str) -> dict[str, Any]:
    slices = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return {d.name: d for s in slices for d in (s.spec.devices or [])}


def kinds(devs: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in devs.values():
        kind = d.attributes["type"].string
        out[kind] = out.get(kind, 0) + 1
    return out


def root_of(dev: Any) -> str:
    return str(dev.attributes[ROOT].string)


def request(name: str, cls: str, count: int = 1, root: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if root:
        cel = f'device.attributes["resource.kubernetes.io"].pcieRoot == "{root}"'
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def make_template(
    resource_api: client.ResourceV1Api, ns: str, name: str, devices_spec: dict[str, Any]
) -> str:
    body = {"metadata": {"name": name}, "spec": {"spec": {"devices": devices_spec}}}
    resource_api.create_namespaced_resource_claim_template(ns, body)
    return name


def pair_spec(config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "requests": [request("gpu", "gpu.patchbay.dev"), request("nic", "vf.patchbay.dev")],
        "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
        "config": config or [],
    }


def allocated(claim: Any) -> dict[str, str]:
    """Request name -> device name of an allocated claim."""
    return {r.request: r.device for r in claim.status.allocation.devices.results}
