"""Fractional GPUs (consumable capacity) end to end on the real control plane.

Two simulated nodes: 8 x A100-80GB with ``--shared-gpus=all``, and 2 x H100
with ``--mig-gpus=all --shared-gpus=all``. The real scheduler packs claims of
the ``shared-gpu.patchbay.dev`` class by their ``memory`` and ``cores``
requests, and keeps one mode per GPU through the counters the shared device
consumes (docs/sharing.md); the node agent prepares the shares through our
socket and resolves their CDI specs, whose HAMi-core limits we assert.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.mig_node import devices, gpu_state, instances
from tests.e2e.pods import claim_of, gone, never_bound, phase, pod, running
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deviceclasses" / "examples" / "four-inference-replicas.yaml"
SHARED = "shared-gpu.patchbay.dev"
HAMI = "/usr/local/vgpu/libvgpu.so"  # a host path CDI mounts; nothing reads it here


def _node(
    cluster: LocalCluster, resource_api: client.ResourceV1Api, topology: str, args: str, want: int
) -> SimNode:
    kubeconfig = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(cluster, unique("frac"), topology, kubeconfig)
    node.plugin.extra_args = tuple(args.split())
    node.start()

    def published() -> bool:
        node.check_alive()
        return len(shared_devices(resource_api, node.name)) == want

    wait_for(f"{want} shared GPUs published on {node.name}", published, timeout=90)
    return node


@pytest.fixture(scope="module")
def nodes(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[tuple[SimNode, SimNode]]:
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    started: list[SimNode] = []
    try:
        started.append(_node(local_cluster, resource_api, "8x-a100", "--shared-gpus=all", 8))
        started.append(
            _node(
                local_cluster,
                resource_api,
                "2-gpus",
                f"--mig-gpus=all --shared-gpus=all --hami-core-library={HAMI}",
                2,
            )
        )
        yield started[0], started[1]
    finally:
        for node in started:
            node.stop()
            delete_quietly(core.delete_node, node.name)


def shared_devices(resource_api: client.ResourceV1Api, node: str) -> list[dict[str, Any]]:
    return [
        d for d in devices(resource_api, node) if d["attributes"]["type"]["string"] == "shared-gpu"
    ]


def claim_template(
    resource_api: client.ResourceV1Api,
    ns: str,
    name: str,
    requests: dict[str, str] | None,
    cel: str = "",
    device_class: str = SHARED,
) -> str:
    """A one-request template: a share of ``requests`` (or a whole device
    of ``device_class`` when None), narrowed by ``cel``."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if requests is not None:
        exactly["capacity"] = {"requests": requests}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    spec = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
    resource_api.create_namespaced_resource_claim_template(
        ns, {"metadata": {"name": name}, "spec": {"spec": spec}}
    )
    return name


def example_template(resource_api: client.ResourceV1Api, ns: str) -> str:
    """The example's claim template, as shipped (request name ``gpu``, renamed ``dev``)."""
    doc = next(
        d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "ResourceClaimTemplate"
    )
    for request in doc["spec"]["spec"]["devices"]["requests"]:
        request["name"] = "dev"
    resource_api.create_namespaced_resource_claim_template(ns, doc)
    return str(doc["metadata"]["name"])


def result_of(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, ns: str, name: str
) -> Any:
    (result,) = claim_of(core, resource_api, ns, name).status.allocation.devices.results
    return result


def env_of(sim: SimNode, ns: str, name: str) -> dict[str, str]:
    record = sim.agent.pod_record(ns, name)
    assert record is not None
    containers = record["containers"]
    assert isinstance(containers, dict)
    (container,) = containers.values()
    return dict(e.split("=", 1) for e in container["env"])


def unschedulable(core: client.CoreV1Api, ns: str, name: str) -> str:
    """The scheduler's own message on a pod it cannot place (waits for it)."""

    def message() -> str | None:
        for cond in core.read_namespaced_pod(name, ns).status.conditions or ():
            if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
                return str(cond.message)
        return None

    return str(wait_for(f"{name} unschedulable", message, timeout=60))


def test_shared_devices_are_published(
    nodes: tuple[SimNode, SimNode], resource_api: client.ResourceV1Api
) -> None:
    a100, h100 = nodes
    (dev, *_) = shared_devices(resource_api, a100.name)
    assert dev["name"] == "gpu-0-shared" and dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["memory"]["value"] == "80Gi"
    assert dev["capacity"]["memory"]["requestPolicy"] == {
        "default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}  # fmt: skip
    assert dev["capacity"]["cores"]["requestPolicy"]["validRange"] == {
        "min": "0", "max": "100", "step": "1"}  # fmt: skip
    assert dev["consumesCounters"] == [
        {"counterSet": "gpu-0-whole", "counters": {"gpu": {"value": "1"}}}
    ]
    (h,) = [d for d in shared_devices(resource_api, h100.name) if d["name"] == "gpu-0-shared"]
    assert h["capacity"]["memory"]["value"] == "81559Mi"
    assert (
        h["capacity"]["memory"]["requestPolicy"]["default"] == "79Gi"
    )  # the last 1Gi step under 81559 MiB
    assert h["consumesCounters"][0]["counterSet"] == "gpu-0-mig"
    assert len(h["consumesCounters"][0]["counters"]) == 10, "the whole MIG counter set"


def test_four_20gib_claims_share_one_a100_and_a_fifth_goes_to_another(
    nodes: tuple[SimNode, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    """First fit packs shares: four fill gpu-0, the fifth goes to gpu-1.

    One at a time, each Running before the next is created: while a claim's
    allocation is written (PreBind), the 1.37 scheduler counts its consumed
    capacity twice, once in flight and once from its claim informer
    (``claimTracker.GatherAllocatedState``: ``aggregatedCapacity.Insert``
    adds), so a pod scheduled in that window may see gpu-0 fuller than it is
    and spill to gpu-1 (the clean-clone CI run of 05f4034 placed 3 + 2).
    """
    a100, ns = nodes[0], namespace
    tmpl = example_template(resource_api, ns)
    names = [f"replica-{i}" for i in range(5)]
    for name in names:
        pod(core, ns, name, a100.name, tmpl)
        running(core, ns, name)
    results = {n: result_of(core, resource_api, ns, n) for n in names}
    placed = sorted(str(r.device) for r in results.values())
    assert placed == ["gpu-0-shared"] * 4 + ["gpu-1-shared"], placed
    assert len({r.share_id for r in results.values()}) == 5, "one share per claim"
    for r in results.values():
        assert r.consumed_capacity == {"memory": "20Gi", "cores": "25"}
    uuids = a100.host.gpu_uuids()
    for name in names:
        env = env_of(a100, ns, name)
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m"
        assert env["CUDA_DEVICE_SM_LIMIT_0"] == "25"
        assert env["NVIDIA_VISIBLE_DEVICES"] in uuids.values()
        assert "LD_PRELOAD" not in env  # no --hami-core-library: advisory limits
    gone(core, ns, *names)


def test_requests_outside_the_published_range_never_schedule(
    nodes: tuple[SimNode, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    a100, ns = nodes[0], namespace
    pod(core, ns, "big", a100.name, claim_template(resource_api, ns, "g90", {"memory": "90Gi"}))
    pod(core, ns, "cores", a100.name, claim_template(resource_api, ns, "c101", {"cores": "101"}))
    for name in ("big", "cores"):
        message = unschedulable(core, ns, name)
        print(f"{name}: {message}")  # the scheduler's own words, shown with -s
        assert "cannot allocate all claims" in message, message
    assert phase(core, ns, "big") == phase(core, ns, "cores") == "Pending"
    gone(core, ns, "big", "cores")


def test_exclusive_claim_waits_for_the_sharers_of_its_gpu(
    nodes: tuple[SimNode, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    h100, ns = nodes[1], namespace
    on0 = 'device.attributes["patchbay.dev"].index == 0'
    share = claim_template(resource_api, ns, "s10", {"memory": "10Gi"}, on0)
    for name in ("s1", "s2"):
        pod(core, ns, name, h100.name, share)
        running(core, ns, name)
    record = h100.agent.pod_record(ns, "s1")
    assert record is not None and isinstance(record["containers"], dict)
    (container,) = record["containers"].values()
    mounts = {m["destination"]: m for m in container["mounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"]["source"] == HAMI, "HAMi-core loaded"
    preload = Path(mounts["/etc/ld.so.preload"]["source"])
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    whole = claim_template(resource_api, ns, "whole-0", None, on0, "gpu.patchbay.dev")
    pod(core, ns, "whole", h100.name, whole)
    print("exclusive:", unschedulable(core, ns, "whole"))
    gone(core, ns, "s1")
    never_bound(core, ns, "whole", within=5)  # one sharer still holds GPU 0
    assert phase(core, ns, "whole") == "Pending"
    gone(core, ns, "s2")
    running(core, ns, "whole")
    assert env_of(h100, ns, "whole")["NVIDIA_VISIBLE_DEVICES"] == gpu_state(h100, 0)["uuid"]
    gone(core, ns, "whole")


def test_mig_claim_does_not_partition_a_gpu_with_sharers(
    nodes: tuple[SimNode, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    h100, ns = nodes[1], namespace
    on0 = 'device.attributes["patchbay.dev"].index == 0'
    pod(
        core, ns, "sharer", h100.name, claim_template(resource_api, ns, "s", {"memory": "8Gi"}, on0)
    )
    running(core, ns, "sharer")
    profile = 'device.attributes["patchbay.dev"].profile == "1g.10gb"'
    mig = claim_template(resource_api, ns, "mig-1g", None, profile, "mig.patchbay.dev")
    pod(core, ns, "mig", h100.name, mig)
    running(core, ns, "mig")
    assert str(result_of(core, resource_api, ns, "mig").device).startswith("gpu-1-mig-")
    assert instances(h100, 0) == [] and not gpu_state(h100, 0)["mig_current"]
    assert len(instances(h100, 1)) == 1
    gone(core, ns, "mig", "sharer")


def test_a_container_with_two_share_claims_sees_one_of_them(
    nodes: tuple[SimNode, SimNode],
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    """What docs/sharing.md says of several claims in one container, through
    the CDI library the runtimes use: one claim's variables win."""
    a100, ns = nodes[0], namespace
    on = 'device.attributes["patchbay.dev"].index == {}'
    claim_template(resource_api, ns, "on2", {"memory": "4Gi"}, on.format(2))
    claim_template(resource_api, ns, "on3", {"memory": "8Gi"}, on.format(3))
    core.create_namespaced_pod(ns, {
        "metadata": {"name": "both"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": a100.name},
            "containers": [{"name": "main", "image": "pause",
                            "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}],
            "resourceClaims": [{"name": "a", "resourceClaimTemplateName": "on2"},
                               {"name": "b", "resourceClaimTemplateName": "on3"}],
        },
    })  # fmt: skip
    running(core, ns, "both")
    env = env_of(a100, ns, "both")
    seen = {(env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"])}
    gpu2, gpu3 = gpu_state(a100, 2)["uuid"], gpu_state(a100, 3)["uuid"]
    print("two claims, one container:", seen, "GPU 2/3:", gpu2, gpu3)
    assert seen <= {(gpu2, "4096m"), (gpu3, "8192m")}, "one claim's pair, never a mix"
    assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env, "each claim numbers its GPUs from 0"
    gone(core, ns, "both")
