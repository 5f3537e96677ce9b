"""patchbay installed with helm on real nodes: the path a user takes.

Each test reads only what a user or an operator can see: pod status and
events, what a container printed (``kubectl logs``), and on the node its CDI
directory and the plugin's checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client, config, watch

from plugin.proto import registration_pb2, registration_pb2_grpc
from tests.e2e.helpers import wait_for
from tests.node.helpers import (
    PLUGIN_LABELS,
    RELEASE_NS,
    UUID,
    Tier,
    allocated,
    attr,
    example,
    on_node,
    seen,
)

# The first test also waits for the session: image build, nodes, helm install.
pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

ROOT = "resource.kubernetes.io/pcieRoot"
BUS = "resource.kubernetes.io/pciBusID"


def test_plugin_pods_ready_registered_publishing(tier: Tier) -> None:
    for node in tier.nodes.values():
        pod = tier.plugin_pod_on(node.name)
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True", pod["status"]
        logs = tier.kubectl("logs", pod["metadata"]["name"], "-n", RELEASE_NS)
        assert "registered with the kubelet as patchbay.dev" in logs, logs[-2000:]
        # The 1.37 kubelet opens the first of v1 and v1alpha1 a plugin offers.
        assert "kubelet opened a health stream (v1.DRAResourceHealth)" in logs, logs[-2000:]
        # The registration socket carries the pod UID (rolling-update names).
        uid = pod["metadata"]["uid"]
        registry = node.real.host_path("/var/lib/kubelet/plugins_registry")
        # The host path is too long for a socket address: connect through a short link.
        with tempfile.TemporaryDirectory(dir="/tmp", prefix="pb") as short:
            link = Path(short) / "r"
            link.symlink_to(registry)
            with grpc.insecure_channel(f"unix://{link}/patchbay.dev-{uid}-reg.sock") as ch:
                info = registration_pb2_grpc.RegistrationStub(ch).GetInfo(
                    registration_pb2.InfoRequest(), timeout=5
                )
        assert info.type == "DRAPlugin"
        assert {"v1.DRAPlugin", "v1beta1.DRAPlugin"} <= set(info.supported_versions)
    slices = tier.get("resourceslices")["items"]
    pools = {s["spec"]["pool"]["name"] for s in slices}
    assert {"node-a", "node-c"} <= pools, pools
    types = {attr(d, "patchbay.dev/type") for s in slices for d in s["spec"].get("devices", [])}
    assert {"gpu", "mig", "vf"} <= types, types


def test_gpu_pods_see_exactly_their_gpus(tier: Tier, namespace: str) -> None:
    ns = namespace
    started = time.monotonic()
    tier.apply(ns, on_node(example("single-gpu.yaml") + example("two-gpus.yaml"), "node-a"))
    node = tier.nodes["node-a"]
    for pod, count in (("gpu-job", 1), ("two-gpu-job", 2)):
        tier.running(ns, pod)
        tier.record(f"{pod}: apply to Running (real kubelet)", f"{time.monotonic() - started:.2f}s")
        got = allocated(tier, ns, pod)
        assert len(got) == count
        env, nodes = seen(tier.logs(ns, pod))
        visible = env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert sorted(visible) == sorted(attr(d, UUID) for _, d in got), (env, got)
        assert {f"/dev/nvidia{attr(d, 'patchbay.dev/minor')}" for _, d in got} <= nodes, nodes
        assert "/dev/nvidiactl" in nodes
    uids = [tier.claim_of(ns, p)["metadata"]["uid"] for p in ("gpu-job", "two-gpu-job")]
    assert all(any(u in name for name in node.claim_specs()) for u in uids)
    for pod in ("gpu-job", "two-gpu-job"):
        tier.delete_pod(ns, pod)
    # The kubelet unprepared both claims: their CDI specs are gone.
    wait_for("CDI specs removed", lambda: not any(
        u in name for u in uids for name in node.claim_specs()), timeout=60)  # fmt: skip


def test_mig_pod_sees_its_mig_device(tier: Tier, namespace: str) -> None:
    tier.apply(namespace, on_node(example("mig-1g.yaml"), "node-a"))
    tier.running(namespace, "mig-1g-job")
    env, _ = seen(tier.logs(namespace, "mig-1g-job"))
    mig = env["NVIDIA_VISIBLE_DEVICES"]
    assert mig.startswith("MIG-"), env
    ((_, device),) = allocated(tier, namespace, "mig-1g-job")
    assert attr(device, "patchbay.dev/type") == "mig"
    # The instance exists in the node's NVML (mock) state under that UUID.
    state = tier.nodes["node-a"].real.sim_dir / "nvml-state.json"
    assert mig in state.read_text()
    tier.delete_pod(namespace, "mig-1g-job")
    wait_for("MIG instance destroyed", lambda: mig not in state.read_text(), timeout=60)


def test_gpu_vf_pair_pod_sees_both_on_one_root(tier: Tier, namespace: str) -> None:
    tier.apply(namespace, on_node(example("gpu-vf-pair.yaml"), "node-a"))
    tier.running(namespace, "rdma-job")
    env, _ = seen(tier.logs(namespace, "rdma-job"))
    got = dict(allocated(tier, namespace, "rdma-job"))
    gpu, vf = got["gpu"], got["nic"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == attr(gpu, UUID)
    assert attr(vf, BUS) in {v for k, v in env.items() if k.endswith("_PCI_BUS_ID")}, env
    assert attr(gpu, ROOT) == attr(vf, ROOT)
    tier.delete_pod(namespace, "rdma-job")


def test_fabric_pod_runs_on_gpu_less_node_after_attach(tier: Tier, namespace: str) -> None:
    tier.apply(namespace, example("fabric-gpu.yaml"))
    pod = tier.running(namespace, "fabric-gpu-job", timeout=180)
    assert pod["spec"]["nodeName"] == "node-c"
    env, _ = seen(tier.logs(namespace, "fabric-gpu-job"))
    claim = tier.claim_of(namespace, "fabric-gpu-job")
    conds = {c["type"]: c["status"] for d in claim["status"]["devices"] for c in d["conditions"]}
    assert conds.get("FabricDeviceReady") == "True", claim["status"]
    ((_, device),) = allocated(tier, namespace, "fabric-gpu-job")
    assert attr(device, "patchbay.dev/attachment") == "fabric"
    assert env["NVIDIA_VISIBLE_DEVICES"] == attr(device, UUID)
    tier.delete_pod(namespace, "fabric-gpu-job")


def _gpu_pod(name: str, template: str, node: str | None = None) -> dict[str, Any]:
    pod = example("single-gpu.yaml")[1]
    pod["metadata"]["name"] = name
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return dict(pod)


def test_bad_config_fails_its_pod_with_the_field_named(tier: Tier, namespace: str) -> None:
    bad = example("single-gpu.yaml")[0]
    bad["metadata"]["name"] = "bad-config"
    bad["spec"]["spec"]["devices"]["config"] = [{
        "requests": ["gpu"],
        "opaque": {"driver": "patchbay.dev", "parameters": {
            "apiVersion": "patchbay.dev/v1alpha1", "kind": "GpuConfig", "timeSlice": "Short"}},
    }]  # fmt: skip
    tier.apply(namespace, [bad, _gpu_pod("bad", "bad-config")])

    def failed() -> list[str]:
        return [e["message"] for e in tier.events(namespace, "bad")
                if e["reason"] == "FailedPrepareDynamicResources"]  # fmt: skip

    messages = wait_for("FailedPrepareDynamicResources on the bad pod", failed, timeout=90)
    assert "timeSlice" in messages[0], messages
    # The real kubelet's Event has the shape the e2e tier's node agent
    # records (hack/k8s/cmd/node-agent), so `kubectl patchbay claims` reads
    # the same column from both tiers.
    assert messages[0].startswith("Failed to prepare dynamic resources: "), messages
    shown = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "kubectl-patchbay"), "claims", "-n", namespace,
         "-o", "json", f"--kubeconfig={tier.cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=60, check=True).stdout)  # fmt: skip
    last = {c["name"]: c["lastError"] for c in shown if "bad" in c["pods"]}
    assert len(last) == 1, shown
    error = next(iter(last.values()))
    assert error["reason"] == "FailedPrepareDynamicResources", error
    assert "timeSlice" in error["message"], error
    assert tier.pod(namespace, "bad")["status"]["phase"] == "Pending"
    node = tier.pod(namespace, "bad")["spec"]["nodeName"]
    tier.apply(namespace, [example("single-gpu.yaml")[0], _gpu_pod("good", "single-gpu", node)])
    tier.running(namespace, "good")
    for pod in ("bad", "good"):
        tier.delete_pod(namespace, pod)


def _count_plugin_pods(tier: Tier, node: str, stop: threading.Event, counts: list[int]) -> None:
    """Until ``stop``: the number of plugin pods on ``node`` after each change,
    from a listing and a watch from its resourceVersion, so no pod's stay,
    however short, goes unseen (re-watched every few seconds to see ``stop``)."""
    api = config.new_client_from_config(config_file=str(tier.cluster.kubeconfig))
    core, query = client.CoreV1Api(api), {"label_selector": PLUGIN_LABELS}
    try:
        listing = core.list_namespaced_pod(RELEASE_NS, **query)
        where = {p.metadata.name: p.spec.node_name for p in listing.items}
        counts.append(sum(n == node for n in where.values()))
        version = listing.metadata.resource_version
        while not stop.is_set():
            for event in watch.Watch().stream(
                core.list_namespaced_pod, RELEASE_NS, resource_version=version,
                timeout_seconds=5, _request_timeout=35, **query,
            ):  # fmt: skip
                pod = event["object"]
                version = pod.metadata.resource_version
                if event["type"] == "DELETED":
                    where.pop(pod.metadata.name, None)
                else:
                    where[pod.metadata.name] = pod.spec.node_name
                counts.append(sum(n == node for n in where.values()))
    finally:
        api.close()


def _alone_and_new(tier: Tier, node: str, old: str) -> bool:
    """The rollout is over on ``node``: one plugin pod there, not ``old``, not
    leaving. From ONE listing: a DaemonSet's new pod is created unbound and
    bound a moment later, so two listings can disagree (a first count of 1,
    then two pods; seen in a clean-clone run)."""
    pods = [p for p in tier.plugin_pods() if p["spec"].get("nodeName") == node]
    return (
        len(pods) == 1
        and pods[0]["metadata"]["uid"] != old
        and not pods[0]["metadata"].get("deletionTimestamp")
    )


def test_helm_upgrade_rolls_plugin_pods_overlapping(tier: Tier, namespace: str) -> None:
    tier.apply(namespace, [example("single-gpu.yaml")[0], _gpu_pod("before", "single-gpu")])
    before = tier.running(namespace, "before")
    cid = before["status"]["containerStatuses"][0]["containerID"]
    node = tier.nodes[before["spec"]["nodeName"]]
    old = tier.plugin_pod_on(node.name)["metadata"]["uid"]
    overlap: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=_count_plugin_pods, args=(tier, node.name, stop, overlap), daemon=True
    )
    watcher.start()
    try:  # the watcher ends with the test, failed or not (it outlived the tier once)
        # A plugin setting change: the DaemonSet's pod template changes, pods roll.
        tier.release.upgrade("kubeletPlugin.logLevel=debug")
        tier.apply(namespace, [_gpu_pod("during", "single-gpu", node.name)])
        tier.running(namespace, "during", timeout=180)
        wait_for("the new plugin pod alone on the node",
                 lambda: _alone_and_new(tier, node.name, old), timeout=180)  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    assert max(overlap) == 2, overlap  # old and new plugin pod served side by side
    after = tier.pod(namespace, "before")
    assert after["status"]["containerStatuses"][0]["containerID"] == cid
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    for pod in ("before", "during"):
        tier.delete_pod(namespace, pod)
    wait_for("no claim left prepared", lambda: not node.claim_specs(), timeout=60)


def test_kubelet_restart_and_plugin_kill_keep_running_pods(tier: Tier, namespace: str) -> None:
    node = tier.nodes["node-a"]
    tier.apply(namespace, [example("single-gpu.yaml")[0],
                           _gpu_pod("steady", "single-gpu", node.name)])  # fmt: skip
    steady = tier.running(namespace, "steady")
    cid = steady["status"]["containerStatuses"][0]["containerID"]
    specs = node.claim_specs()
    node.real.restart_kubelet()
    plugin = tier.plugin_pod_on(node.name)
    pcid = plugin["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    node.real.ctr("tasks", "kill", "--signal", "SIGKILL", pcid)

    def restarted() -> bool:
        status = tier.plugin_pod_on(node.name)["status"]["containerStatuses"][0]
        return bool(status.get("restartCount", 0) >= 1 and status.get("ready"))

    wait_for("plugin container restarted by the kubelet and Ready", restarted, timeout=120)
    tier.apply(namespace, [_gpu_pod("later", "single-gpu", node.name)])
    tier.running(namespace, "later", timeout=180)
    now = tier.pod(namespace, "steady")["status"]["containerStatuses"][0]
    assert (now["containerID"], now["restartCount"]) == (cid, 0)
    assert set(specs) <= set(node.claim_specs())
    for pod in ("steady", "later"):
        tier.delete_pod(namespace, pod)
    wait_for("nothing left prepared", lambda: not node.claim_specs()
             and not node.checkpoint_claims(), timeout=90)  # fmt: skip
