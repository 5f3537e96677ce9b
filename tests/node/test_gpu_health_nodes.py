"""Device health (KEP-4680) in a real pod's status, from the real kubelet.

A GPU that reports a critical XID (here through the node's NVML mock, the
C library the plugin loads) must show ``Unhealthy`` in the
``status.containerStatuses[].allocatedResourcesStatus`` of the pod that
holds it: the plugin's ``DRAResourceHealth`` stream feeds the kubelet's
health cache, and the kubelet writes it into pod status (``ResourceHealthStatus``,
beta and on in 1.37). The kubelet reads a device's health as ``Unknown``
once its lease (30 s unless the plugin names one) passed without a report,
so the test also has the kubelet rewrite the pod's status after a lease
with no change, and the GPU must still read ``Unhealthy`` there.

The GPU's health outlives the plugin (docs/health.md), so a restart of the
plugin pod while it is unhealthy keeps it tainted; the test ends through the
recovery path: the pod goes, its claim is unprepared, the plugin resets the
GPU (the node's nvidia-smi), checks it and publishes it untainted, telling
each step as an Event on the Node, in order. The tier runs the chart's
production default, ``NoExecute`` for the reset class: this pod's claim
tolerates the taint, so it stays to show its health.

The recovery story (issue 38, "what it must show"): a Deployment's pod runs
on a GPU and the mock raises a reset-class XID. The GPU is tainted
``NoExecute``; kube-controller-manager's device-taint eviction deletes the
pod, and the Deployment's new pod runs on another, healthy GPU while the
evicted one still holds the failed GPU (its container ends on cue: no reset
while a prepared claim uses the GPU); once it is gone the plugin resets the
GPU, checks it and publishes it healthy, and a new pod runs on it. The
Events of the plugin, the controller manager, the ReplicaSet and the kubelet
tell that story in order (causal order, compared to the second across
components, which stamp their Events with the one host clock).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from fabric.simhost.host import SimHost
from plugin.servers.health import KUBELET_DEFAULT_LEASE_S
from tests.e2e.helpers import wait_for
from tests.node.helpers import PLUGIN_LABELS, RELEASE_NS, Tier, attr, example, on_node

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

UUID = "patchbay.dev/uuid"
TAINT = "patchbay.dev/unhealthy"
# A claim that keeps its pod on the GPU through the reset class's NoExecute taint.
TOLERATE = [{"key": TAINT, "operator": "Exists", "effect": "NoExecute"}]
XID = 48  # double-bit ECC error: critical
# The second container ends a lease and a margin after it is told to
# (kubectl exec ... touch /tmp/lease); the kubelet then rewrites the pod's
# status, health included, after a lease in which nothing changed.
LEASE_FLAG = "/tmp/lease"
BEAT = (
    f"while [ ! -e {LEASE_FLAG} ]; do sleep 1; done; "
    f"sleep {KUBELET_DEFAULT_LEASE_S + 10}; echo lease passed"
)


def sick_pod() -> list[dict[str, Any]]:
    """The single-GPU example, plus a claim-less container that ends on cue."""
    template, pod = example("single-gpu.yaml")
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = TOLERATE
    pod["metadata"]["name"] = "sick"
    beat = {"name": "beat", "image": "busybox:1.35", "command": ["sh", "-c", BEAT]}
    pod["spec"]["containers"].append(beat)
    return on_node([template, pod], "node-a")


def health(pod: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """The main container's allocated resources: resource ID -> (health, message)."""
    return {
        r["resourceID"]: (r["health"], r.get("message"))
        for cs in pod["status"].get("containerStatuses", [])
        if cs["name"] == "main"
        for rs in cs.get("allocatedResourcesStatus") or []
        for r in rs.get("resources") or []
    }


def beat_ended(tier: Tier, ns: str) -> dict[str, Any] | None:
    """The pod once its ``beat`` container has ended, else None."""
    pod = tier.pod(ns, "sick")
    ended = any(
        cs["name"] == "beat" and "terminated" in cs.get("state", {})
        for cs in pod["status"].get("containerStatuses", [])
    )
    return pod if ended else None


def taints(tier: Tier, key: tuple[str, str]) -> list[tuple[str, str]] | None:
    """The published device's taints (key, effect); None while it is not published."""
    device = tier.devices_by_name().get(key)
    if device is None:
        return None
    return [(t["key"], t["effect"]) for t in device.get("taints", [])]


def restart_plugin(tier: Tier, node: str) -> None:
    """Delete ``node``'s plugin pod; wait until its replacement is Ready and
    the kubelet has registered it and opened its health stream."""
    old = tier.plugin_pod_on(node)["metadata"]
    tier.kubectl("delete", "pod", "-n", RELEASE_NS, old["name"])

    def serving() -> bool:
        pods = [p for p in tier.get("pods", "-n", RELEASE_NS, "-l", PLUGIN_LABELS)["items"]
                if p["spec"].get("nodeName") == node]  # fmt: skip
        if len(pods) != 1 or pods[0]["metadata"]["uid"] == old["uid"]:
            return False
        logs = tier.kubectl("logs", pods[0]["metadata"]["name"], "-n", RELEASE_NS, check=False)
        return "registered with the kubelet" in logs and "kubelet opened a health stream" in logs

    wait_for(f"a new plugin pod serving the kubelet on {node}", serving, timeout=180)


def recovery_events(tier: Tier, node: str) -> list[str]:
    """The reasons of the plugin's GPU Events on ``node``, oldest first (the
    core/v1 view, as ``kubectl describe node`` reads them)."""
    events = tier.get("events", "-n", "default", "--field-selector",
                      f"involvedObject.name={node}")["items"]  # fmt: skip
    ours = [e for e in events if e.get("reportingComponent") == "patchbay.dev/plugin"
            and e["reason"].startswith(("Gpu", "DeviceUnhealthy"))]  # fmt: skip
    ours.sort(key=lambda e: e.get("eventTime") or e.get("firstTimestamp")
              or e["metadata"]["creationTimestamp"])  # fmt: skip
    return [e["reason"] for e in ours]


def test_critical_xid_shows_unhealthy_in_pod_status(tier: Tier, namespace: str) -> None:
    ns, node = namespace, tier.nodes["node-a"]
    tier.apply(ns, sick_pod())
    tier.running(ns, "sick")
    claim = tier.claim_of(ns, "sick")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    key = (result["pool"], result["device"])
    gpu = tier.devices_by_name()[key]
    # The kubelet names a device by its first CDI ID (the plugin's own, not the metadata file's).
    rid = f"k8s.patchbay.dev/claim={claim['metadata']['uid']}-{result['device']}"
    wait_for("the GPU Healthy in the pod's status", lambda: health(tier.pod(ns, "sick")) == {
        rid: ("Healthy", None)}, timeout=60)  # fmt: skip

    SimHost.open(node.real.sim_dir).nvml.queue_xid(attr(gpu, UUID), XID)
    try:
        message = f"GPU reported critical XID {XID} (reset class, tainted)"  # waits for its pod
        wait_for("the GPU Unhealthy in the pod's status", lambda: health(tier.pod(ns, "sick")) == {
            rid: ("Unhealthy", message)}, timeout=60)  # fmt: skip
        # A lease later, with nothing new to report, the kubelet still reads it
        # Unhealthy: the plugin renewed its report (else it would read Unknown).
        tier.kubectl("exec", "sick", "-n", ns, "-c", "beat", "--", "touch", LEASE_FLAG)
        pod = wait_for("the beat container ended", lambda: beat_ended(tier, ns),
                       timeout=KUBELET_DEFAULT_LEASE_S + 60)  # fmt: skip
        assert health(pod) == {rid: ("Unhealthy", message)}, pod["status"]["containerStatuses"]
        # The scheduler no longer hands the GPU out (the pod tolerates the eviction).
        assert taints(tier, key) == [(TAINT, "NoExecute")]
        # A restart keeps it so: the health is the plugin's record, not its memory.
        restart_plugin(tier, node.name)
        assert taints(tier, key) == [(TAINT, "NoExecute")]
    finally:  # the rest of the session gets the GPU back, through the recovery path
        tier.delete_pod(ns, "sick")
        # Its claim unprepared, the plugin resets, checks (settle window) and publishes it.
        wait_for("the GPU published untainted", lambda: taints(tier, key) == [], timeout=240)
    reasons = recovery_events(tier, node.name)
    steps = ["DeviceUnhealthy", "GpuResetStarted", "GpuReset", "GpuHealthy"]
    assert [r for r in reasons if r in steps][-4:] == steps, reasons


# The Deployment's container ends only once told to (kubectl exec ... touch),
# also when it is evicted: until then its claim holds the failed GPU.
RELEASE = "/tmp/release"
HOLD = f"trap 'until [ -e {RELEASE} ]; do sleep 1; done; exit 0' TERM; while :; do sleep 1; done"
WORKER = {"app": "worker"}
STEPS = ["DeviceUnhealthy", "GpuResetWaiting", "GpuResetStarted", "GpuReset", "GpuHealthy"]


def worker() -> list[dict[str, Any]]:
    """The single-GPU example's claim template and a one-pod Deployment on node-a."""
    template, pod = example("single-gpu.yaml")
    spec = on_node([pod], "node-a")[0]["spec"]
    spec |= {"restartPolicy": "Always", "terminationGracePeriodSeconds": 600}
    spec["containers"][0]["command"] = ["sh", "-c", HOLD]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "worker"},
        "spec": {"replicas": 1, "selector": {"matchLabels": WORKER},
                 "template": {"metadata": {"labels": WORKER}, "spec": spec}},
    }  # fmt: skip
    return [template, deployment]


def on_gpu(uuid: str) -> list[dict[str, Any]]:
    """Pod ``again`` on node-a, its claim asking for the GPU ``uuid`` by name."""
    template, pod = example("single-gpu.yaml")
    template["metadata"]["name"] = "that-gpu"
    cel = f'device.attributes["patchbay.dev"].uuid == "{uuid}"'
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": cel}}
    ]
    pod["metadata"]["name"] = "again"
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "that-gpu"
    return on_node([template, pod], "node-a")


def device_of(tier: Tier, ns: str, pod: str) -> tuple[str, str]:
    (result,) = tier.claim_of(ns, pod)["status"]["allocation"]["devices"]["results"]
    return result["pool"], result["device"]


def worker_running(tier: Tier, ns: str, not_on: tuple[str, str] | None = None) -> str | None:
    """The name of a Running, ready worker pod not being deleted (and not on
    the device ``not_on``), else None."""
    for p in tier.get("pods", "-n", ns, "-l", "app=worker")["items"]:
        status = p["status"]
        if p["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        if not all(c.get("ready") for c in status.get("containerStatuses", [])):
            continue
        name = str(p["metadata"]["name"])
        if not_on is None or device_of(tier, ns, name) != not_on:
            return name
    return None


def stamp(event: dict[str, Any]) -> datetime:
    """When an Event happened (events.k8s.io: eventTime, to the microsecond;
    core/v1 writers: firstTimestamp, to the second)."""
    raw = event.get("eventTime") or event.get("firstTimestamp")
    return datetime.fromisoformat(raw or event["metadata"]["creationTimestamp"])


def one(tier: Tier, ns: str, name: str, reason: str) -> dict[str, Any]:
    """The first Event of ``reason`` about object ``name``."""
    found = sorted((e for e in tier.events(ns, name) if e["reason"] == reason), key=stamp)
    assert found, f"no {reason} Event about {name}: {[e['reason'] for e in tier.events(ns, name)]}"
    return found[0]


def gone(tier: Tier, ns: str, pod: str) -> bool:
    return not tier.kubectl("get", "pod", pod, "-n", ns, "--ignore-not-found", "-o", "name")


def node_events(tier: Tier, node: str) -> list[dict[str, Any]]:
    return list(tier.events("default", node))


def occurrences(event: dict[str, Any]) -> int:
    """How often an Event happened: the plugin writes a repeat of the same
    note (one GPU's step again, in one plugin process) as its series' count."""
    return int((event.get("series") or {}).get("count") or event.get("count") or 1)


def last_seen(event: dict[str, Any]) -> datetime:
    """When an Event last happened (a series: its last observation)."""
    raw = (event.get("series") or {}).get("lastObservedTime")
    return datetime.fromisoformat(raw) if raw else stamp(event)


def test_a_reset_class_xid_evicts_the_pod_and_the_gpu_comes_back(
    tier: Tier, namespace: str
) -> None:
    ns, node = namespace, tier.nodes["node-a"]
    tier.apply(ns, worker())
    old = wait_for("the Deployment's pod Running", lambda: worker_running(tier, ns), timeout=180)
    key = device_of(tier, ns, old)
    uuid = attr(tier.devices_by_name()[key], UUID)
    # The first test may have told the same steps of this GPU: new ones, or repeats.
    seen = {e["metadata"]["uid"]: occurrences(e) for e in node_events(tier, node.name)}
    SimHost.open(node.real.sim_dir).nvml.queue_xid(uuid, XID)  # reset class
    try:
        wait_for("the GPU tainted NoExecute",
                 lambda: taints(tier, key) == [(TAINT, "NoExecute")], timeout=60)  # fmt: skip
        wait_for("the pod evicted", lambda: tier.pod(ns, old)["metadata"].get(
            "deletionTimestamp"), timeout=60)  # fmt: skip
        new = wait_for("the Deployment's new pod Running on another GPU",
                       lambda: worker_running(tier, ns, not_on=key), timeout=180)  # fmt: skip
        (owner,) = tier.pod(ns, new)["metadata"]["ownerReferences"]
        rs = str(owner["name"])  # the ReplicaSet that made it
        assert taints(tier, device_of(tier, ns, new)) == []  # a healthy one
        # The evicted pod still holds the failed GPU prepared: it is not reset under it.
        assert taints(tier, key) == [(TAINT, "NoExecute")]
        tier.kubectl("exec", old, "-n", ns, "--", "touch", RELEASE)
        wait_for("the evicted pod gone", lambda: gone(tier, ns, old), timeout=90)
        wait_for("the GPU reset, checked and published untainted",
                 lambda: taints(tier, key) == [], timeout=240)  # fmt: skip
        tier.apply(ns, on_gpu(uuid))
        tier.running(ns, "again")
        assert device_of(tier, ns, "again") == key  # a new pod runs on it
    finally:  # no pod left, and the GPU back through the recovery path whatever failed
        for p in tier.get("pods", "-n", ns, "-l", "app=worker")["items"]:
            tier.kubectl("exec", p["metadata"]["name"], "-n", ns, "--", "touch", RELEASE,
                         check=False)  # fmt: skip
        tier.kubectl("delete", "deployment", "worker", "-n", ns, "--wait=false", check=False)
        tier.kubectl("delete", "pod", "again", "-n", ns, "--ignore-not-found", "--wait=false")
        wait_for("the test's pods gone", lambda: not tier.get("pods", "-n", ns)["items"],
                 timeout=120)  # fmt: skip
        wait_for("the GPU published untainted", lambda: taints(tier, key) == [], timeout=240)

    ours = [e for e in node_events(tier, node.name)
            if occurrences(e) > seen.get(e["metadata"]["uid"], 0)
            and e.get("reportingComponent") == "patchbay.dev/plugin"
            and uuid in (e.get("message") or "")]  # fmt: skip
    ours.sort(key=last_seen)  # the plugin's own: to the microsecond
    reasons = [e["reason"] for e in ours]
    assert [r for r in reasons if r in STEPS] == STEPS, reasons
    assert not {"GpuRecoveryFailed", "GpuFailedAfterReset"} & set(reasons), reasons
    at = {e["reason"]: last_seen(e) for e in ours}
    created = [e for e in tier.events(ns, rs) if e["reason"] == "SuccessfulCreate"
               and (e.get("message") or "").endswith(new)]  # fmt: skip
    assert created, f"no SuccessfulCreate of {new} about ReplicaSet {rs}"
    story = [
        ("the GPU failed", at["DeviceUnhealthy"]),
        ("its pod evicted", stamp(one(tier, ns, old, "DeviceTaintManagerEviction"))),
        ("the new pod created", stamp(created[0])),
        ("the new pod started", stamp(one(tier, ns, new, "Started"))),
        ("the GPU reset", at["GpuResetStarted"]),
        ("the GPU checked", at["GpuReset"]),
        ("the GPU healthy", at["GpuHealthy"]),
        ("a pod started on it", stamp(one(tier, ns, "again", "Started"))),
    ]
    seconds = [t.replace(microsecond=0) for _, t in story]  # core/v1 writers: to the second
    assert seconds == sorted(seconds), story
