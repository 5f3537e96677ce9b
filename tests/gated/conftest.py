"""The gated tier: real nodes with Kubernetes 1.37 feature gates that are off by default.

Why this tier exists: PodGroup claims (KEP-5729) need ``GenericWorkload``
and ``DRAWorkloadResourceClaims`` (beta in 1.37.2, off by default) on the
apiserver, scheduler, controller-manager and kubelet, and the
``scheduling.k8s.io/v1beta1`` API group that the apiserver serves only when
asked (``--runtime-config``). Every other tier keeps 1.37's default gates
(issue 25), so this one has its own control plane and node: the real-node
launcher (tests/harness/realnode.py) with its ``gates`` and
``runtime_config`` parameters, one node (node-a: GPUs, a NIC), the chart
installed with helm without the controller or the fabric. Beta gates only:
an alpha gate would switch the scheduler to its experimental allocator, and
belongs in a tier of its own.

Run with ``make test-gated`` (``make test`` runs it after the node tier).
Needs root and the node binaries and images, like the node tier: missing,
the run FAILS under ``CI=true``, else the tier is skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import run_dirs
from tests.cluster_fixtures import missing_prerequisite, record_startup
from tests.node.helpers import Node, Tier

REPO = Path(__file__).resolve().parents[2]
RUN_DIR = Path(os.environ.get("PATCHBAY_GATED_RUN_DIR", f"/tmp/pb-gated-{os.getuid()}"))
# The gates a PodGroup's claims need in 1.37.2 (pkg/features/kube_features.go:
# DRAWorkloadResourceClaims depends on DynamicResourceAllocation, on by
# default, and GenericWorkload), on every component, the kubelet included
# (pkg/kubelet/cm/dra/manager.go refuses a claim reserved for a PodGroup
# without DRAWorkloadResourceClaims).
GATES = {"GenericWorkload": True, "DRAWorkloadResourceClaims": True}
# PodGroup lives in scheduling.k8s.io/v1beta1, off unless the apiserver is told.
RUNTIME_CONFIG = ("scheduling.k8s.io/v1beta1=true",)
# Its own bridge, so that a kept node tier (PATCHBAY_NODE_KEEP=1) does not clash.
NET_INDEX = 1


def _prerequisites() -> None:
    if os.geteuid() != 0:
        missing_prerequisite("the gated tier runs real nodes: it needs root")
    proc = subprocess.run(
        ["make", "-s", "-C", str(REPO), "node-bins", "images"], check=False, text=True
    )
    if proc.returncode != 0:
        missing_prerequisite("`make node-bins images` failed (see its output above)")


@contextmanager
def real_tier(
    run_dir: Path,
    net_index: int,
    gates: Mapping[str, bool],
    runtime_config: tuple[str, ...] = (),
    chart_sets: tuple[str, ...] = (),
    keep: bool = False,
) -> Iterator[Tier]:
    """One node (node-a: GPUs, a NIC) on a control plane of its own with
    ``gates``, the chart installed (plus ``chart_sets``); down at the end
    unless ``keep`` (leave it running to look around)."""
    _prerequisites()
    from tests.harness import realnode, realnode_chart

    node = realnode.NodeSpec("node-a", "2x-h100-nic", {"patchbay.dev/simulated": "true"})
    cluster = realnode.RealCluster(
        run_dir, [node], net_index=net_index, gates=gates, runtime_config=runtime_config
    )
    try:
        cluster.up(detach=keep)
    except (realnode.ComponentError, realnode.PrerequisiteError, realnode.net.NetError) as err:
        cluster.down()
        pytest.fail(f"gated nodes did not start: {err}", pytrace=False)
    record_startup(f"gated real node {sorted(gates)} (control plane + 1 node Ready)",
                   cluster.startup_seconds)  # fmt: skip
    release = realnode_chart.Release(cluster.kubeconfig, run_dir / "chart", None)
    t = Tier(cluster, {n: Node(cluster.nodes[n]) for n in cluster.nodes}, release)
    try:
        try:
            release.install(*chart_sets)
        except realnode_chart.HelmError as err:
            pytest.fail(f"{err}\n{cluster.log_tails()}", pytrace=False)
        yield t
    finally:
        if not keep:
            killed = cluster.down()
            assert killed == [], f"ignored SIGTERM at teardown and were killed: {killed}"
            run_dirs.done_with(run_dir)


@pytest.fixture(scope="session")
def tier() -> Iterator[Tier]:
    keep = os.environ.get("PATCHBAY_GATED_KEEP") == "1"
    with real_tier(RUN_DIR, NET_INDEX, GATES, RUNTIME_CONFIG, keep=keep) as t:
        yield t


@pytest.fixture
def namespace(tier: Tier) -> Iterator[str]:
    name = tier.new_namespace()
    yield name
    tier.kubectl("delete", "namespace", name, "--wait=false", check=False)
