"""The real-node tier: kubelet + containerd + runc nodes, the chart installed with helm.

Why this module exists: every other cluster tier stops one step short of a
node (no kubelet, no container). Here one session brings up the control
plane on the node bridge and two real nodes (tests/harness/realnode.py: node-a with
4 GPUs and VFs, node-c GPU-less with fabric adapters), installs
``helm/patchbay`` with ``hack/simulated-values.yaml`` plus the controller,
the simulated fabric (a CXL fabric: GPUs, an NVMe drive, CXL memory behind
node-c's adapters) and GPU sharing (a fractional GPU, the MPS supervisor),
and the tests run the examples of
``deviceclasses/examples/`` as real containers.

Needs root (namespaces, mounts, cgroups), the node binaries and images
(`make node-bins images`). Missing: under ``CI=true`` the run FAILS, else the
tier is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import run_dirs
from tests.cluster_fixtures import missing_prerequisite, record_startup
from tests.node.helpers import IDLE_WINDOW_S, Node, Tier

REPO = Path(__file__).resolve().parents[2]
RUN_DIR = Path(os.environ.get("PATCHBAY_NODE_RUN_DIR", f"/tmp/pb-node-{os.getuid()}"))
# GPU sharing on node-a (tests/node/test_sharing_nodes.py): GPU 3 is also a
# fractional GPU, and MPS daemons run in the MPS supervisor's pods.
# GPU health (tests/node/test_gpu_health_nodes.py): the chart's taint effects
# (NoExecute for the reset class: the Deployment's pod is evicted, the sick pod's
# claim tolerates it), and a short settle window after each reset (order is
# asserted there, never durations).
# Idle devices and leases (tests/node/test_lease_nodes.py): a short idle
# window sampled every second, and the controller's lease clock on; no
# DeviceLeasePolicy outside that module's own namespaces, so elsewhere an
# Idle condition on a claim is all it does.
TIER_VALUES = {
    "kubeletPlugin": {
        "sharedGpus": "3", "mpsSupervisor": True,
        "gpuHealthSettle": 5.0,
        "idleSampleInterval": 1.0, "idleWindow": float(IDLE_WINDOW_S),
    },
    "controller": {"deviceLeases": True},
}  # fmt: skip


def _prerequisites() -> None:
    if os.geteuid() != 0:
        missing_prerequisite("the real-node tier needs root (namespaces, mounts, cgroups)")
    proc = subprocess.run(
        ["make", "-s", "-C", str(REPO), "node-bins", "images"], check=False, text=True
    )
    if proc.returncode != 0:
        missing_prerequisite("`make node-bins images` failed (see its output above)")


@pytest.fixture(scope="session")
def tier() -> Iterator[Tier]:
    _prerequisites()
    from tests.harness import realnode, realnode_chart

    keep = os.environ.get("PATCHBAY_NODE_KEEP") == "1"  # leave it running to look around
    cluster = realnode.RealCluster(RUN_DIR, realnode.DEFAULT_NODES)
    try:
        cluster.up(detach=keep)
    except (realnode.ComponentError, realnode.PrerequisiteError, realnode.net.NetError) as err:
        cluster.down()
        pytest.fail(f"real nodes did not start: {err}", pytrace=False)
    record_startup("real nodes (control plane + 2 nodes Ready)", cluster.startup_seconds)
    release = realnode_chart.Release(cluster.kubeconfig, RUN_DIR / "chart", "node-c")
    tier_values = RUN_DIR / "chart" / "tier-values.yaml"
    tier_values.parent.mkdir(parents=True, exist_ok=True)
    tier_values.write_text(yaml.safe_dump(TIER_VALUES))
    release.values.append(tier_values)  # every helm call of the session, upgrades too
    t = Tier(cluster, {n: Node(cluster.nodes[n]) for n in cluster.nodes}, release)
    (RUN_DIR / "figures.json").unlink(missing_ok=True)
    for name, seconds in cluster.ready_seconds.items():
        t.record(f"{name} start to Ready", f"{seconds:.1f}s (namespaces, containerd, kubelet)")
        kubelet = cluster.nodes[name].kubelet_ready_seconds
        t.record(f"{name} kubelet start to Node Ready", f"{kubelet:.2f}s")
    try:
        started = time.monotonic()
        try:
            release.install()
        except realnode_chart.HelmError as err:
            pytest.fail(f"{err}\n{cluster.log_tails()}", pytrace=False)
        t.record("helm install --wait (plugin, controller, fabric Ready)",
                 f"{time.monotonic() - started:.1f}s")  # fmt: skip
        yield t
    finally:
        if not keep:
            killed = cluster.down()
            assert killed == [], f"ignored SIGTERM at teardown and were killed: {killed}"
            run_dirs.done_with(RUN_DIR)


@pytest.fixture
def namespace(tier: Tier) -> Iterator[str]:
    name = tier.new_namespace()
    yield name
    tier.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:  # pragma: no cover - reporting
    path = RUN_DIR / "figures.json"
    if path.exists():  # written by the session; the run dir goes after this (tests.run_dirs)
        for key, value in json.loads(path.read_text()).items():
            terminalreporter.write_line(f"real nodes: {key}: {value}")
