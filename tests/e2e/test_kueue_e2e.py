"""Kueue v0.17 quotas over patchbay devices, on the real control plane.

The real Kueue manager (``make kueue-bin``; tests/e2e/kueue_manager.py) runs
with the shipped configuration (deviceclasses/examples/kueue/kueue-config.yaml:
DRA gates and deviceClassMappings) and its webhooks; the shipped queues
(queues.yaml: two ClusterQueues of 2 GPUs in one cohort, team-a with one 1g
MIG slice) and Kueue-ready templates (templates.yaml) are applied under
unique names. One simulated 4 x H100 node offers whole GPUs and dynamic MIG
slices; the Jobs' pods run on it through the node agent and our plugin.

Team B's two 1-GPU Jobs run; team A's three 1-GPU Jobs: two run, the third
stays suspended for lack of quota in the cohort; once B's Jobs complete, it
borrows B's GPU and runs. A mig-1g Job is charged ``patchbay.dev/mig-1g``
(not a GPU) and gets a 1g slice; a second one waits on that resource while
GPU quota is free.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.kueue_manager import USER, KueueManager
from tests.e2e.plugin_nodes import plugin_node
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deviceclasses" / "examples" / "kueue"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
GPU, MIG_1G = "patchbay.dev/gpu", "patchbay.dev/mig-1g"
DEVICES = 4 * (1 + 7 + 1 + 4 + 3 + 2 + 1 + 1)  # 4 H100: the GPU and every MIG placement offered


@pytest.fixture(scope="module")
def node(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    with plugin_node(
        local_cluster, resource_api, core, "kq", "4x-h100", args=("--mig-gpus=all",),
        ready=lambda n: n == DEVICES, what="GPUs and MIG devices published",
    ) as sim:  # fmt: skip
        yield sim


@pytest.fixture(scope="module")
def kueue(local_cluster: LocalCluster, api_client: client.ApiClient) -> Iterator[KueueManager]:
    kubeconfig = local_cluster.kubeconfig_for("kueue", USER)
    manager = KueueManager(api_client, kubeconfig, Path(local_cluster.run_dir) / "kueue")
    manager.install()
    try:
        manager.start()
        yield manager
    finally:
        manager.stop()


def devices(resource_api: client.ResourceV1Api, node: str) -> dict[str, Any]:
    slices = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    out = {}
    for s in slices:
        for d in resource_api.api_client.sanitize_for_serialization(s)["spec"].get("devices") or []:
            out[d["name"]] = d
    return out


def renamed(docs: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    """The example objects under unique names (the cluster is shared)."""
    for doc in docs:
        meta, spec = doc["metadata"], doc.get("spec") or {}
        meta["name"] = names.get(meta["name"], meta["name"])
        if "namespace" in meta:
            meta["namespace"] = names[meta["namespace"]]
        for key in ("cohortName", "clusterQueue"):
            if key in spec:
                spec[key] = names[spec[key]]
        for group in spec.get("resourceGroups", []):
            for flavor in group["flavors"]:
                flavor["name"] = names[flavor["name"]]
    return docs


@pytest.fixture
def teams(
    kueue: KueueManager, api_client: client.ApiClient, resource_api: client.ResourceV1Api
) -> Iterator[dict[str, str]]:
    names = {n: unique("kq-" + n) for n in ("team-a", "team-b", "patchbay", "all-teams")}
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    docs = renamed(list(yaml.safe_load_all((EXAMPLES / "queues.yaml").read_text())), names)
    templates = list(yaml.safe_load_all((EXAMPLES / "templates.yaml").read_text()))
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind == "Namespace":
            core.create_namespace(doc)
            for tmpl in templates:
                resource_api.create_namespaced_resource_claim_template(meta["name"], tmpl)
        elif kind == "LocalQueue":
            custom.create_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], "localqueues", doc
            )
        else:
            custom.create_cluster_custom_object(GROUP, VERSION, kind.lower() + "s", doc)
    yield {"a": names["team-a"], "b": names["team-b"]}
    for team in ("team-a", "team-b"):
        delete_quietly(client.BatchV1Api(api_client).delete_collection_namespaced_job, names[team],
                       propagation_policy="Background")  # fmt: skip
        delete_quietly(core.delete_collection_namespaced_pod, names[team], grace_period_seconds=0)
        delete_quietly(core.delete_namespace, names[team])
        delete_quietly(
            custom.delete_cluster_custom_object, GROUP, VERSION, "clusterqueues", names[team]
        )
    delete_quietly(
        custom.delete_cluster_custom_object, GROUP, VERSION, "resourceflavors", names["patchbay"]
    )


def submit(batch: client.BatchV1Api, ns: str, name: str, template: str, node: str) -> None:
    """The example Job (job.yaml) under another name, on our node, with a template."""
    job = yaml.safe_load((EXAMPLES / "job.yaml").read_text())
    job["metadata"].update(name=name, namespace=ns)
    pod = job["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["resourceClaims"][0]["resourceClaimTemplateName"] = template
    pod["containers"][0]["image"] = "pause"
    del pod["containers"][0]["command"]
    batch.create_namespaced_job(ns, job)


def workload(custom: client.CustomObjectsApi, ns: str, job: str) -> dict[str, Any] | None:
    items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, "workloads")["items"]
    for wl in items:
        if any(
            o["kind"] == "Job" and o["name"] == job
            for o in wl["metadata"].get("ownerReferences", [])
        ):
            return dict(wl)
    return None


def condition(wl: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((wl or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def pending_on(custom: client.CustomObjectsApi, ns: str, job: str, resource: str) -> dict[str, Any]:
    """Wait until Kueue has tried the Job's Workload and found no quota for ``resource``."""

    def pending() -> dict[str, Any] | None:
        c = condition(workload(custom, ns, job), "QuotaReserved")
        return (
            c if c and c["status"] == "False" and f"quota for {resource}" in c["message"] else None
        )

    return dict(wait_for(f"{job} pending on {resource}", pending, timeout=60))


def running_pod(core: client.CoreV1Api, ns: str, job: str, timeout: float = 90) -> Any:
    def running() -> Any:
        pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    return wait_for(f"a Running pod of {job}", running, timeout=timeout)


def allocated(core: client.CoreV1Api, resource_api: client.ResourceV1Api, pod: Any) -> Any:
    """The device result of the pod's claim (from its template)."""
    (status,) = core.read_namespaced_pod(
        pod.metadata.name, pod.metadata.namespace
    ).status.resource_claim_statuses
    claim = resource_api.read_namespaced_resource_claim(
        status.resource_claim_name, pod.metadata.namespace
    )
    (result,) = claim.status.allocation.devices.results
    return result


def suspended(batch: client.BatchV1Api, ns: str, job: str) -> bool:
    return bool(batch.read_namespaced_job(job, ns).spec.suspend)


def gpu_usage(custom: client.CustomObjectsApi, cq: str, total: int, borrowed: int) -> None:
    """Wait until the ClusterQueue reports this GPU usage (Kueue updates its status
    after admissions, not with them)."""
    want = {"total": str(total), "borrowed": str(borrowed)}
    seen: list[Any] = []

    def reported() -> bool:
        obj = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", cq)
        usage = (obj.get("status") or {}).get("flavorsUsage") or []
        seen[:] = [usage]
        for flavor in usage:
            for res in flavor["resources"]:
                if res["name"] == GPU:
                    return {k: str(res.get(k, "0")) for k in want} == want
        return False

    wait_for(f"{cq} using {want} of {GPU} (last: {seen})", reported, timeout=30)


def complete(core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, *jobs: str) -> None:
    """Let the jobs' pods exit 0 (the node agent's complete-after annotation)."""
    for job in jobs:
        for p in core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items:
            done = {"metadata": {"annotations": {"patchbay.dev/complete-after": "0s"}}}
            core.patch_namespaced_pod(p.metadata.name, ns, done)
    for job in jobs:
        wait_for(
            f"{job} complete",
            lambda j=job: (batch.read_namespaced_job(j, ns).status.succeeded or 0) == 1,
        )


def test_cohort_borrowing_and_mig_charged_per_profile(
    node: SimNode,
    teams: dict[str, str],
    kueue: KueueManager,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
) -> None:
    batch, custom = client.BatchV1Api(api_client), client.CustomObjectsApi(api_client)
    a, b = teams["a"], teams["b"]
    ours = devices(resource_api, node.name)

    for job in ("b1", "b2"):
        submit(batch, b, job, "one-gpu", node.name)
    for job in ("b1", "b2"):
        running_pod(core, b, job)
    for job in ("a1", "a2", "a3"):
        submit(batch, a, job, "one-gpu", node.name)
    gpus = [allocated(core, resource_api, running_pod(core, a, j)) for j in ("a1", "a2")]
    pending_on(custom, a, "a3", GPU)
    assert suspended(batch, a, "a3"), "Kueue's webhook suspends a queued Job until admitted"
    assert not core.list_namespaced_pod(a, label_selector="job-name=a3").items
    gpu_usage(custom, a, total=2, borrowed=0)

    complete(core, batch, b, "b1", "b2")
    gpus.append(allocated(core, resource_api, running_pod(core, a, "a3")))
    assert not suspended(batch, a, "a3")
    gpu_usage(custom, a, total=3, borrowed=1)  # a3 borrows team-b's GPU
    for result in gpus:
        assert (result.driver, result.pool) == ("patchbay.dev", node.name)
        assert ours[result.device]["attributes"]["type"]["string"] == "gpu"
    assert len({r.device for r in gpus}) == 3

    submit(batch, a, "m1", "mig-1g", node.name)
    mig = allocated(core, resource_api, running_pod(core, a, "m1"))
    assert (mig.driver, mig.pool) == ("patchbay.dev", node.name)
    attrs = ours[mig.device]["attributes"]
    assert (attrs["type"]["string"], attrs["computeSlices"]["int"]) == ("mig", 1)
    admission = (workload(custom, a, "m1") or {})["status"]["admission"]
    (assignment,) = admission["podSetAssignments"]
    assert assignment["resourceUsage"] == {MIG_1G: "1"}, "a 1g slice is charged as mig-1g only"
    gpu_usage(custom, a, total=3, borrowed=1)

    # team-a's one mig-1g is in use and team-b has none to lend; GPU quota is free.
    submit(batch, a, "m2", "mig-1g", node.name)
    pending_on(custom, a, "m2", MIG_1G)
    assert suspended(batch, a, "m2")
    kueue.check_alive()
