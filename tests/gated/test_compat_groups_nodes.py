"""One mode per GPU through device compatibility groups (KEP-5963), alpha tier.

Why this module exists: ``DRADeviceCompatibilityGroups`` is alpha in 1.37.2
(off by default, needs ``DRAPartitionableDevices``, beta and on), and an
alpha DRA gate switches the scheduler to its experimental allocator, so it
runs on a control plane and node of its own (``real_tier``, its own bridge),
never beside the beta gates of the PodGroup tier. The chart runs with
``kubeletPlugin.compatibilityGroups=true`` and ``sharedGpus=all`` (dynamic
MIG on every GPU, from the simulated values): MIG placements publish group
``mig``, the shared device group ``shared`` and none of its GPU's counters.

What it shows, on the real apiserver and scheduler:

- on node-a, with the real plugin: a MIG claim whose only GPU with room is
  the one a share holds (the other three held whole) is refused by the
  scheduler, and runs on that GPU once the share is gone;
- that the refusal comes from the groups: the plugin's own slices, copied to
  a kubelet-less node ``ghost``, refuse it the same way, and once the copy's
  groups are removed (nothing else changed) the scheduler gives the MIG
  claim a placement of the GPU the share holds.

The ghost's pods only get scheduled (no kubelet runs them); they tolerate
the taints a node without a kubelet gets.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import wait_for
from tests.gated.conftest import real_tier
from tests.node.helpers import Tier

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

RUN_DIR = Path(os.environ.get("PATCHBAY_ALPHA_RUN_DIR", f"/tmp/pb-alpha-{os.getuid()}"))
GATES = {"DRADeviceCompatibilityGroups": True}  # pkg/features: alpha in 1.37, off
NET_INDEX = 2  # node tier 0, PodGroup tier 1
CHART = ("kubeletPlugin.sharedGpus=all", "kubeletPlugin.compatibilityGroups=true")
DRIVER, GHOST = "patchbay.dev", "ghost"
UNSCHEDULABLE = "cannot allocate all claims"


@pytest.fixture(scope="module")
def alpha() -> Iterator[Tier]:
    keep = os.environ.get("PATCHBAY_ALPHA_KEEP") == "1"
    with real_tier(RUN_DIR, NET_INDEX, GATES, chart_sets=CHART, keep=keep) as t:
        yield t


@pytest.fixture
def ns(alpha: Tier) -> Iterator[str]:
    name = alpha.new_namespace()
    yield name
    alpha.kubectl("delete", "namespace", name, "--wait=false", check=False)


def template(name: str, device_class: str, *, share: bool = False, count: int = 1) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if share:
        exactly["capacity"] = {"requests": {"memory": "10Gi"}}
    if count > 1:
        exactly["count"] = count
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}},
    }


def pod(name: str, claim_template: str, node: str) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": claim_template}],
            "containers": [{
                "name": "main", "image": "busybox:1.35",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
                "resources": {"claims": [{"name": "dev"}]},
            }],
        },
    }  # fmt: skip


def allocated(t: Tier, ns: str, name: str) -> str | None:
    """The device the pod's claim was allocated, once it has one."""
    statuses = t.pod(ns, name)["status"].get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = t.get("resourceclaim", statuses[0]["resourceClaimName"], "-n", ns)
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    return str(results["results"][0]["device"]) if results.get("results") else None


def refused(t: Tier, ns: str, name: str) -> str:
    """Wait for the scheduler to say it cannot allocate the pod's claims; its message."""

    def probe() -> str | None:
        for c in t.pod(ns, name)["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and UNSCHEDULABLE in c.get("message", ""):
                return str(c["message"])
        return None

    message = str(wait_for(f"{name}: {UNSCHEDULABLE!r}", probe, timeout=120))
    assert allocated(t, ns, name) is None, "refused, yet allocated"
    return message


def block_all_gpus_but_one(t: Tier, ns: str, node: str) -> set[int]:
    """Three of the node's four GPUs held whole, so that the share and then
    the partition have one GPU to go to (a lean MIG placement names no GPU
    a claim could pin it to, issue 26); the indices held."""
    t.apply(ns, [template("block", "local-gpu.patchbay.dev", count=3),
                 pod("blocker", "block", node)])  # fmt: skip
    claim = wait_for("three GPUs held", lambda: claim_of(t, ns, "blocker"), 120)
    held = {gpu_of(r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]}
    assert len(held) == 3, held
    return held


def claim_of(t: Tier, ns: str, name: str) -> Any:
    """The pod's claim, once allocated."""
    statuses = t.pod(ns, name)["status"].get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = t.get("resourceclaim", statuses[0]["resourceClaimName"], "-n", ns)
    return claim if (claim.get("status") or {}).get("allocation") else None


def gpu_of(device: str) -> int:
    """``gpu-1-shared`` / ``gpu-1-mig-1g-10gb-3`` -> 1."""
    return int(device.split("-")[1])


def node_pool(t: Tier, node: str) -> list[dict[str, Any]]:
    return [
        s for s in t.get("resourceslices")["items"]
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == node
    ]  # fmt: skip


def consumptions(slices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d.get("consumesCounters") or []
            for s in slices for d in s["spec"].get("devices") or []}  # fmt: skip


def test_a_partition_waits_for_the_share_on_its_gpu(alpha: Tier, ns: str) -> None:
    # What the plugin published, as the gated apiserver kept it.
    used = consumptions(node_pool(alpha, "node-a"))
    assert used["gpu-0"] and "compatibilityGroups" not in used["gpu-0"][0]
    assert used["gpu-0-shared"] == [{"counterSet": "gpu-0-mig", "compatibilityGroups": [
        "shared"], "counters": {"mem0": {"value": "0"}}}]  # fmt: skip
    placements = [n for n in used if "-mig-" in n]
    assert placements and all(used[n][0]["compatibilityGroups"] == ["mig"] for n in placements)

    held = block_all_gpus_but_one(alpha, ns, "node-a")
    alpha.apply(ns, [template("share", "shared-gpu.patchbay.dev", share=True),
                     pod("sharer", "share", "node-a")])  # fmt: skip
    alpha.running(ns, "sharer", timeout=180)
    gpu = gpu_of(str(allocated(alpha, ns, "sharer")))
    assert gpu not in held
    alpha.apply(ns, [template("part", "mig-1g.patchbay.dev"),
                     pod("partition", "part", "node-a")])  # fmt: skip
    refused(alpha, ns, "partition")

    alpha.delete_pod(ns, "sharer")
    alpha.running(ns, "partition", timeout=180)
    device = str(allocated(alpha, ns, "partition"))
    assert device.startswith(f"gpu-{gpu}-mig-1g-"), device


def ghost_node() -> Any:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "20"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": GHOST, "labels": {"kubernetes.io/hostname": GHOST}},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }  # fmt: skip


def ghost_copy(slices: list[dict[str, Any]], generation: int, groups: bool) -> list[Any]:
    """node-a's slices as a pool of the ghost, with or without their groups."""
    out = []
    for i, s in enumerate(sorted(slices, key=lambda s: s["metadata"]["name"])):
        spec = copy.deepcopy(s["spec"])
        spec["pool"] = {"name": GHOST, "generation": generation, "resourceSliceCount": len(slices)}
        if "nodeName" in spec:
            spec["nodeName"] = GHOST
        for device in spec.get("devices") or []:
            for used in device.get("consumesCounters") or []:
                if not groups:
                    used.pop("compatibilityGroups", None)
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": f"{GHOST}-{i}"}, "spec": spec})  # fmt: skip
    return out


def test_without_the_groups_a_partition_joins_the_share(alpha: Tier, ns: str) -> None:
    node = ghost_node()
    alpha.kubectl("create", "-f", "-", stdin=_yaml([node]))
    # As a kubelet does: the status (allocatable pods, Ready) in its own write.
    alpha.kubectl("patch", "node", GHOST, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": node["status"]}))  # fmt: skip
    published = node_pool(alpha, "node-a")
    alpha.kubectl("create", "-f", "-", stdin=_yaml(ghost_copy(published, 1, groups=True)))

    held = block_all_gpus_but_one(alpha, ns, GHOST)
    alpha.apply(ns, [template("share", "shared-gpu.patchbay.dev", share=True),
                     pod("sharer", "share", GHOST)])  # fmt: skip
    share = wait_for("the ghost's share allocated", lambda: allocated(alpha, ns, "sharer"), 120)
    gpu = gpu_of(share)
    assert gpu not in held
    alpha.apply(ns, [template("part", "mig-1g.patchbay.dev"),
                     pod("partition", "part", GHOST)])  # fmt: skip
    refused(alpha, ns, "partition")  # the copy refuses as node-a's own pool does

    # The same slices without their groups (a new pool generation): the
    # counters alone no longer keep the modes apart.
    stored = {s["metadata"]["name"]: s for s in alpha.get("resourceslices")["items"]}
    stripped = ghost_copy(published, 2, groups=False)
    for s in stripped:
        s["metadata"]["resourceVersion"] = stored[s["metadata"]["name"]]["metadata"][
            "resourceVersion"
        ]
    alpha.kubectl("replace", "-f", "-", stdin=_yaml(stripped))
    mixed = wait_for("the partition allocated", lambda: allocated(alpha, ns, "partition"), 120)
    assert gpu_of(mixed) == gpu and "-mig-" in mixed, mixed
    assert allocated(alpha, ns, "sharer") == share, "the share still holds the GPU"


def _yaml(docs: list[Any]) -> str:
    return str(yaml.safe_dump_all(docs))
