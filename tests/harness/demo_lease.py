"""``make demo``'s device lease: one lease that expires while you watch.

Why this module exists: the demo turns the controller's lease clock on
through the chart's values (``controller.deviceLeases``, as an operator
would; docs/leases.md), applies a DeviceLeasePolicy for a namespace of its
own and a notebook's claim there asking for a two-minute lease, shows it in
``kubectl patchbay leases``, then prints what happens to it as it happens:
the warning a minute before the end, the expiry, the notebook's pod
evicted and the claim released. Kept apart from :mod:`tests.harness.demo`
so that the demo's flow stays readable there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import demo_spare, realnode

REPO = Path(__file__).resolve().parents[2]
NS = "demo-lease"
POLICY = "demo-notebooks"
CLAIM, POD = "notebook-mig", "notebook"
LEASE = "2m"  # the claim's lease; the policy warns 1m before its end
NODE = "node-a"
VALUES: dict[str, Any] = {"controller": {"deviceLeases": True}}
# The smallest MIG slice (deviceclasses/examples/mig-1g.yaml): node-a's last
# GPU has room for it beside the demo's two other MIG workloads.
MIG_1G = (
    'device.attributes["patchbay.dev"].computeSlices == 1 && '
    'device.attributes["patchbay.dev"].memorySlots == 1 && '
    '!device.attributes["patchbay.dev"].mediaEngines'
)


def objects() -> list[dict[str, Any]]:
    """The namespace, its policy, the notebook's claim (a reason and a
    two-minute lease) and its pod on node-a."""
    policy = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "DeviceLeasePolicy",
              "metadata": {"name": POLICY},
              "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                       "deviceClassNames": ["mig.patchbay.dev", "gpu.patchbay.dev"],
                       "requireReason": True, "defaultDuration": "1h", "maxDuration": "8h",
                       "warningBefore": "1m", "evictionGracePeriodSeconds": 5}}  # fmt: skip
    notes = {"patchbay.dev/lease-reason": "demo notebook, ticket ML-482",
             "patchbay.dev/lease-duration": LEASE}  # fmt: skip
    mig = {"deviceClassName": "mig.patchbay.dev", "selectors": [{"cel": {"expression": MIG_1G}}]}
    request = {"name": "mig", "exactly": mig}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": CLAIM, "namespace": NS, "annotations": notes},
             "spec": {"devices": {"requests": [request]}}}  # fmt: skip
    script = "trap 'exit 0' TERM; while :; do sleep 1; done"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NS},
           "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [{"name": "main", "image": "busybox:1.35",
                                    "command": ["sh", "-c", script],
                                    "resources": {"claims": [{"name": "mig"}]}}],
                    "resourceClaims": [{"name": "mig", "resourceClaimName": CLAIM}]}}  # fmt: skip
    return [policy, claim, pod]


def start(cluster: realnode.RealCluster) -> None:
    """Apply the policy, the claim and the notebook's pod (the lease starts
    when the scheduler allocates the claim)."""
    cluster.kubectl("create", "namespace", NS, check=True)
    demo_spare.wait(f"the default ServiceAccount in namespace {NS}", lambda: (
        cluster.kubectl("get", "serviceaccount", "default", "-n", NS, check=False).returncode
        == 0 or None), 60)  # fmt: skip
    cluster.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": objects()}))  # fmt: skip


def leases_table(cluster: realnode.RealCluster) -> str:
    """``kubectl patchbay leases -n demo-lease``, this repository's plugin."""
    cli = Path(sys.executable).parent / "kubectl-patchbay"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [str(cli), "leases", "-n", NS, f"--kubeconfig={cluster.kubeconfig}"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return (proc.stdout or proc.stderr).rstrip()


def _events(cluster: realnode.RealCluster, name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", NS, "--field-selector",
                          f"involvedObject.name={name}", "-o", "json").stdout  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out or "{}").get("items", [])
    return items


def _event(cluster: realnode.RealCluster, name: str, reason: str) -> str | None:
    found = [e["message"] for e in _events(cluster, name) if e["reason"] == reason]
    return found[0] if found else None


def _gone(cluster: realnode.RealCluster, kind: str, name: str) -> bool | None:
    out = cluster.kubectl("get", kind, name, "-n", NS, "--ignore-not-found", "-o", "name").stdout
    return True if not out.strip() else None


def watch_expiry(cluster: realnode.RealCluster) -> None:
    """Print the lease, then its warning, expiry, the eviction and the release."""
    print(f"\ndevice lease: DeviceLeasePolicy {POLICY} governs namespace {NS}; claim "
          f"{CLAIM} asks for a {LEASE} lease (warning 1m before its end)")  # fmt: skip
    demo_spare.wait(f"the lease of {CLAIM} started",
                    lambda: _event(cluster, CLAIM, "LeaseStarted"), 120)  # fmt: skip
    print(f"$ kubectl patchbay leases -n {NS}\n{leases_table(cluster)}")
    warned = demo_spare.wait(f"LeaseExpiring on {CLAIM}",
                             lambda: _event(cluster, CLAIM, "LeaseExpiring"), 180)  # fmt: skip
    print(f"  Warning LeaseExpiring: {warned}")
    print(f"$ kubectl patchbay leases -n {NS}\n{leases_table(cluster)}")
    ended = demo_spare.wait(f"LeaseExpired on {CLAIM}",
                            lambda: _event(cluster, CLAIM, "LeaseExpired"), 180)  # fmt: skip
    print(f"  Warning LeaseExpired: {ended}")
    demo_spare.wait(f"pod {POD} evicted", lambda: _gone(cluster, "pod", POD), 120)
    print(f"  pod {POD} evicted (the Eviction API, grace period 5s) and gone")
    demo_spare.wait(f"claim {CLAIM} released", lambda: _gone(cluster, "resourceclaim", CLAIM), 120)
    print(f"  claim {CLAIM} released and deleted (an expired standalone claim is never "
          "handed out again)")  # fmt: skip
