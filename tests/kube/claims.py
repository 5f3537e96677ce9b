"""Test-side helpers to create ResourceClaims and allocate them by hand.

Integration tests have no scheduler in the loop: they write the allocation
into the claim's status as the scheduler would (through the real apiserver,
which validates it), then play the kubelet against the plugin.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client


def allocated_claim(
    api: client.ResourceV1Api,
    namespace: str,
    name: str,
    node: str,
    devices: list[str],
    *,
    config: list[dict[str, Any]] | None = None,
    driver: str = "patchbay.dev",
    pool: str = "",
) -> str:
    """Create a claim for ``devices`` of ``node``'s pool (or ``pool``), allocated; its UID."""
    requests = [
        {"name": f"req-{i}", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}
        for i in range(len(devices))
    ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": requests}},
    }
    created = api.create_namespaced_resource_claim(namespace, body)
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": f"req-{i}", "driver": driver, "pool": pool or node, "device": d}
                    for i, d in enumerate(devices)
                ],
                "config": config or [],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    obj = api.read_namespaced_resource_claim(name, namespace)
    patched = api.api_client.sanitize_for_serialization(obj)
    patched["status"] = status
    api.replace_namespaced_resource_claim_status(name, namespace, patched)
    return str(created.metadata.uid)
