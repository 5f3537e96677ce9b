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
each step as an Event on the Node, in order. The tier runs the reset class
with NoSchedule (tests/node/conftest.py) so the pod stays to show its health.
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric.simhost.host import SimHost
from plugin.servers.health import KUBELET_DEFAULT_LEASE_S
from tests.e2e.helpers import wait_for
from tests.node.helpers import PLUGIN_LABELS, RELEASE_NS, Tier, attr, example, on_node

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

UUID = "patchbay.dev/uuid"
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
        # The scheduler no longer hands the GPU out.
        assert taints(tier, key) == [("patchbay.dev/unhealthy", "NoSchedule")]
        # A restart keeps it so: the health is the plugin's record, not its memory.
        restart_plugin(tier, node.name)
        assert taints(tier, key) == [("patchbay.dev/unhealthy", "NoSchedule")]
    finally:  # the rest of the session gets the GPU back, through the recovery path
        tier.delete_pod(ns, "sick")
        # Its claim unprepared, the plugin resets, checks (settle window) and publishes it.
        wait_for("the GPU published untainted", lambda: taints(tier, key) == [], timeout=240)
    reasons = recovery_events(tier, node.name)
    steps = ["DeviceUnhealthy", "GpuResetStarted", "GpuReset", "GpuHealthy"]
    assert [r for r in reasons if r in steps][-4:] == steps, reasons
