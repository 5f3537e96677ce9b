"""A PodGroup's claim on a real node (KEP-5729, gates of tests/gated/conftest.py).

Three pods name the group in ``spec.schedulingGroup.podGroupName`` and
the claim the group lists in ``spec.resourceClaims``. The scheduler
reserves the claim for the group, not for each pod (``reservedFor`` names
``scheduling.k8s.io`` ``podgroups``); the kubelet prepares it once on the
node, and unprepares it only when the last of the group's pods on the node
is gone. What a user and an operator see is checked: pod status, what the
containers printed, the claim, ``kubectl patchbay claims``, and on the node
the claim's CDI spec file and the plugin's checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import wait_for
from tests.node.helpers import Tier, seen

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

GROUP, CLAIM, SIZE = "trainers", "shared-gpu", 3


def claim_doc() -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": CLAIM},
        "spec": {"devices": {"requests": [request]}},
    }


def group_doc() -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": GROUP},
        "spec": {
            "schedulingPolicy": {"basic": {}},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM}],
        },
    }


def pod_doc(name: str) -> dict[str, Any]:
    script = (
        "env | grep -E '^(NVIDIA|PATCHBAY)_' | sort; trap 'exit 0' TERM; while :; do sleep 1; done"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "schedulingGroup": {"podGroupName": GROUP},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.35",
                    "command": ["sh", "-c", script],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def test_a_pod_group_shares_one_claim_until_its_last_pod_goes(tier: Tier, namespace: str) -> None:
    ns = namespace
    tier.apply(ns, [claim_doc(), group_doc()])
    names = [f"trainer-{i}" for i in range(SIZE)]
    tier.apply(ns, [pod_doc(n) for n in names])
    pods = [tier.running(ns, n, timeout=300) for n in names]

    # One node, one claim reserved for the group (never for a pod).
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    node = tier.nodes[pods[0]["spec"]["nodeName"]]
    claim = tier.get("resourceclaim", CLAIM, "-n", ns)
    uid = claim["metadata"]["uid"]
    assert [
        (r.get("apiGroup"), r["resource"], r["name"]) for r in claim["status"]["reservedFor"]
    ] == [("scheduling.k8s.io", "podgroups", GROUP)]
    # Every container got the same device from the one prepared claim.
    envs = [seen(tier.logs(ns, n))[0] for n in names]
    assert envs[0] and all(e == envs[0] for e in envs), envs
    specs = [s for s in node.claim_specs() if uid in s]
    assert len(specs) == 1, node.claim_specs()
    assert uid in node.checkpoint_claims()

    # kubectl patchbay claims shows the group as the claim's holder.
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl-patchbay"), "claims", "-n", ns,
         "-o", "json", f"--kubeconfig={tier.cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    [view] = [v for v in json.loads(out) if v["name"] == CLAIM]
    assert view["state"] == "reserved" and view["podGroups"] == [GROUP], view

    # The kubelet removes a pod's object only after its resources are
    # reclaimed (its claims unprepared, or left for the other pods): each
    # deletion below has finished on the node once the pod is gone.
    for name in names[:-1]:
        tier.delete_pod(ns, name)
        assert any(uid in s for s in node.claim_specs()), f"unprepared after {name} went"
        assert uid in node.checkpoint_claims(), f"unprepared after {name} went"
    tier.delete_pod(ns, names[-1])
    wait_for(
        "the claim unprepared after its last pod",
        lambda: (
            not any(uid in s for s in node.claim_specs()) and uid not in node.checkpoint_claims()
        ),
        timeout=60,
    )
