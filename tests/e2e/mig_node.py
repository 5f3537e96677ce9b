"""A simulated node partitioning its GPUs with MIG, running our plugin, as the
e2e tests see it: the ``sim`` fixture (module-scoped: one node per module
that takes it), its published MIG devices, claims by profile, and the GPU
state and instances of the node's NVML mock.

Why: the MIG, fractional-GPU and ``kubectl patchbay`` e2e modules run
their tests on such a node and read it the same way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.plugin_nodes import plugin_node
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

PER_GPU = 1 + 7 + 1 + 4 + 3 + 2 + 1 + 1  # +me at its lowest start only (issue 26)


@pytest.fixture(scope="module")
def sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    with plugin_node(
        local_cluster, resource_api, core, "mig", "2-gpus", args=("--mig-gpus=all",),
        ready=lambda n: n == 2 * PER_GPU, what="MIG devices published",
    ) as node:  # fmt: skip
        yield node


def slice_specs(resource_api: client.ResourceV1Api, node: str) -> list[dict[str, Any]]:
    items = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    items.sort(key=lambda s: s.metadata.name)
    return [resource_api.api_client.sanitize_for_serialization(s)["spec"] for s in items]


def devices(resource_api: client.ResourceV1Api, node: str) -> list[dict[str, Any]]:
    return [d for s in slice_specs(resource_api, node) for d in s.get("devices") or []]


def template(resource_api: client.ResourceV1Api, ns: str, name: str, cls: str, cel: str) -> None:
    request = {"name": "dev", "exactly": {"deviceClassName": cls,
               "selectors": [{"cel": {"expression": cel}}]}}  # fmt: skip
    resource_api.create_namespaced_resource_claim_template(
        ns, {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [request]}}}}
    )


def profile_template(resource_api: client.ResourceV1Api, ns: str, profile: str) -> str:
    name = f"mig-{profile.replace('.', '-')}"
    cel = f'device.attributes["patchbay.dev"].profile == "{profile}"'
    template(resource_api, ns, name, "mig.patchbay.dev", cel)
    return name


def allocated(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, ns: str, name: str
) -> str:
    status = core.read_namespaced_pod(name, ns).status
    claim = resource_api.read_namespaced_resource_claim(
        status.resource_claim_statuses[0].resource_claim_name, ns
    )
    (result,) = claim.status.allocation.devices.results
    return str(result.device)


def gpu_state(sim: SimNode, index: int) -> dict[str, Any]:
    gpus = sorted(sim.host.nvml.read()["gpus"], key=lambda g: g["pci_bus_id"])
    return dict(gpus[index])


def instances(sim: SimNode, index: int) -> list[tuple[int, int, list[str]]]:
    return sorted(
        (gi["profile_id"], gi["start"], [ci["uuid"] for ci in gi["compute_instances"]])
        for gi in gpu_state(sim, index)["gpu_instances"]
    )
