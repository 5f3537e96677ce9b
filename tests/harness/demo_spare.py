"""``make demo``'s warm spare: a pod that takes one runs without waiting for an attach.

Why this module exists: the demo configures one fixed warm spare per node
through the chart's values (``controller.sparesFixed``, as an operator
would; docs/fabric.md, "Warm spares"), waits until the controller has one
attached to node-c, runs a pod whose claim prefers a spare, and prints what
shows it took one: no binding conditions in its allocation, its Running
time after the allocation (against a pod that waited for its attach), the
``SpareTaken`` Event, and the replacement spare the controller attached.
Kept apart from :mod:`tests.harness.demo` so that the demo's flow stays
readable there.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from driver.fabric_devices.naming import in_fabric_pool, is_adapter_pool
from tests.harness import poll, realnode, realnode_chart

NODE = "node-c"  # the GPU-less node behind the fabric
FABRIC_POOL = "fabric"  # the chart's controller.fabricPool
POD = "spare-gpu-job"
# What a DeviceClass or claim that prefers spares selects (docs/fabric.md).
SPARE_CEL = (
    '"spare" in device.attributes["patchbay.dev"] && device.attributes["patchbay.dev"].spare'
)


def values(node: str) -> dict[str, Any]:
    """The demo's fabric values (:func:`realnode_chart.fabric_values`) with one
    more GPU behind adapter0, for the spare pod and the spare that replaces
    it, and one fixed spare of the fabric's GPU model per node."""
    out = copy.deepcopy(realnode_chart.fabric_values(node))
    sw0 = out["fabric"]["topology"]["fabrics"][0]["switches"][0]
    gpu = next(s["device"] for s in sw0["slots"] if s["device"]["kind"] == "gpu")
    extra = {"kind": "gpu", "id": "gpu-6", "model": gpu["model"]}
    sw0["slots"].append({"port": f"slot{len(sw0['slots'])}", "device": extra})
    out["controller"]["sparesFixed"] = f"gpu:{gpu['model']}=1"
    return out


def objects(ns: str) -> list[dict[str, Any]]:
    """A claim template whose first choice is a spare (any fabric GPU else),
    and a pod on node-c that prints what it was given."""
    spare = {"name": "spare", "deviceClassName": "gpu.patchbay.dev",
             "selectors": [{"cel": {"expression": SPARE_CEL}}]}  # fmt: skip
    anyone = {"name": "any", "deviceClassName": "gpu.patchbay.dev"}
    tmpl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "spare-gpu", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "firstAvailable": [spare, anyone]}]}}}}  # fmt: skip
    script = ("env | grep -E '^(NVIDIA|PATCHBAY)_' | sort; "
              "ls /dev | grep nvidia | sed 's|^|/dev/|'; "
              "trap 'exit 0' TERM; while :; do sleep 1; done")  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": ns},
           "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [{"name": "main", "image": "busybox:1.35",
                                    "command": ["sh", "-c", script],
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu",
                                        "resourceClaimTemplateName": "spare-gpu"}]}}  # fmt: skip
    return [tmpl, pod]


def _get(cluster: realnode.RealCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def spares(cluster: realnode.RealCluster) -> dict[str, str]:
    """Fabric device -> published name of every spare offered on node-c (in the
    per-domain shape its slice names the node; per-node, its variant does)."""
    out = {}
    for s in _get(cluster, "resourceslices")["items"]:
        for d in s["spec"].get("devices", []):
            attrs = d.get("attributes", {})
            on = d.get("nodeName") or s["spec"].get("nodeName")
            if attrs.get("spare", {}).get("bool") and on == NODE:
                out[attrs["fabricDevice"]["string"]] = d["name"]
    return out


def wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """``check()``'s first answer other than None; the demo stops naming ``what``."""
    try:
        return poll.wait_for(what, check, timeout, done=lambda got: got is not None)
    except poll.WaitTimedOut:
        raise SystemExit(f"demo: {what} not seen within {timeout:.0f} s") from None


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def claim_of(cluster: realnode.RealCluster, ns: str, pod: str) -> dict[str, Any]:
    p = _get(cluster, "pod", pod, "-n", ns)
    name = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim: dict[str, Any] = _get(cluster, "resourceclaim", name, "-n", ns)
    return claim


def allocation_to_running(cluster: realnode.RealCluster, ns: str, pod: str) -> float | None:
    """Seconds from the pod's claim's allocation to its container's start (the
    API's timestamps: whole seconds); None before both are known."""
    p = _get(cluster, "pod", pod, "-n", ns)
    states = [c.get("state", {}) for c in p["status"].get("containerStatuses", [])]
    started = next((s["running"]["startedAt"] for s in states if "running" in s), None)
    claims = p["status"].get("resourceClaimStatuses", [])
    if started is None or not claims:
        return None
    alloc = claim_of(cluster, ns, pod)["status"]["allocation"]
    return (_when(started) - _when(alloc["allocationTimestamp"])).total_seconds()


def binding_line(cluster: realnode.RealCluster, ns: str, pod: str) -> str | None:
    """For a Running pod with a fabric device: its binding conditions and its
    Running time after the allocation; None for any other pod."""
    took = allocation_to_running(cluster, ns, pod)
    claim = claim_of(cluster, ns, pod) if took is not None else {}
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    fabric = [r for r in results.get("results", []) if in_fabric_pool(r["pool"], FABRIC_POOL)
              and not is_adapter_pool(r["pool"], FABRIC_POOL)]  # fmt: skip
    if took is None or not fabric:
        return None
    waits = sorted({c for r in fabric for c in r.get("bindingConditions") or ()})
    return f"{pod:16} {took:3.0f} s   {', '.join(waits) or 'none (a warm spare)'}"


def take_a_spare(cluster: realnode.RealCluster, ns: str) -> str:
    """Wait for the fixed spare, run the pod that takes it, print what shows
    it and the replacement; the pod's name (for the demo's report)."""
    first = wait("a warm spare on node-c", lambda: spares(cluster) or None, 120)
    print(f"\nwarm spare: {', '.join(sorted(first))} attached to {NODE} in advance, "
          "published without binding conditions")  # fmt: skip
    cluster.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": objects(ns)}))  # fmt: skip
    took = wait(f"{POD} Running", lambda: allocation_to_running(cluster, ns, POD), 120)
    claim = claim_of(cluster, ns, POD)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    conditions = result.get("bindingConditions") or "none"
    print(f"{POD} took {result['device']} ({result['request']}): binding conditions "
          f"{conditions}; Running {took:.0f} s after its allocation")  # fmt: skip
    selector = f"involvedObject.name={claim['metadata']['name']},reason=SpareTaken"
    event = wait("the SpareTaken Event", lambda: cluster.kubectl(
        "get", "events", "-n", ns, "--field-selector", selector,
        "-o", "jsonpath={.items[*].message}").stdout or None, 60)  # fmt: skip
    print(f"  SpareTaken: {event}")
    new = wait("the replacement spare", lambda: set(spares(cluster)) - set(first) or None, 120)
    print(f"  replaced: {', '.join(sorted(new))} is {NODE}'s warm spare now")
    return POD
