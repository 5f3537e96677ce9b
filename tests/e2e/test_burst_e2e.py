"""A hundred pods at once on the real control plane (issue 17, "Bursts").

Two simulated nodes of this module's own (tests/e2e/burst.py: a MIG node and
a GPU + VF node) and the first node of the fabric environment
(tests/e2e/conftest.py); 100 pods asking for a 1g MIG partition, a whole
local GPU, a fabric GPU, a netdev VF or a vfio-pci VF are created
concurrently, about three times what fits. The real scheduler admits what
fits and leaves the rest Pending with its own reason; the node agent
prepares the admitted ones through our socket. Checked: every admitted pod
Running, every device in exactly one claim's CDI spec and checkpoint record
and nowhere else (tests/e2e/burst_audit.py); the first wave deleted, the
waiting pods take its place; everything deleted, nothing left on the nodes
and no fabric attachment.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e.burst import (
    BurstNodes,
    burst_nodes,
    create_burst,
    create_templates,
    delete_pods,
    is_settled,
    settle_state,
)
from tests.e2e.burst_audit import allocations, audit, leftovers
from tests.e2e.fabric_helpers import Env
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def nodes(
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
    env: Env,
) -> Iterator[BurstNodes]:
    """The burst's MIG and GPU + VF nodes, and the first node of the fabric
    environment (tests/e2e/conftest.py) as the fabric node."""
    work: Path = tmp_path_factory.mktemp("burst")
    with burst_nodes(local_cluster, resource_api, core, work) as n:
        yield n.with_fabric(env.nodes[0])


def settled(
    core: client.CoreV1Api,
    resource_api: client.ResourceV1Api,
    nodes: BurstNodes,
    ns: str,
    pods: int,
) -> dict[str, str]:
    """Wait until every pod runs or waits and each pool is full; the Running ones.
    On a timeout the failure says where the pods stand and what the audit found."""
    deadline = time.monotonic() + 120
    while not is_settled(state := settle_state(core, ns), pods, nodes):
        if time.monotonic() > deadline:
            pytest.fail(
                f"{pods} pods did not settle in 120s: Running per pool "
                f"{state.running_per_pool(nodes)} (want {nodes.capacity}), "
                f"waiting {len(state.waiting)}, "
                f"neither: {state.other}; audit: {audit(resource_api, ns, nodes)}"
            )
        time.sleep(1.0)
    assert len(state.running) == sum(nodes.capacity.values())
    for name, why in state.waiting.items():
        assert why.startswith("Unschedulable: ") and "claim" in why, (name, why)
    return dict(state.running)


def test_burst_admits_what_fits_and_leaves_nothing(
    nodes: BurstNodes,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    namespace: str,
    env: Env,
) -> None:
    ns = namespace
    create_templates(resource_api, ns, nodes.kinds)
    create_burst(core, ns, nodes)
    assert nodes.pods == 100
    first = settled(core, resource_api, nodes, ns, nodes.pods)
    kinds = {k.name: k for k in nodes.kinds}
    for name, node in first.items():
        assert nodes.by_role[kinds[name.rsplit("-", 1)[0]].node].name == node
        assert nodes.by_role[nodes.role_of(node)].agent.pod_record(ns, name) is not None, name
    assert len(allocations(resource_api, ns)) == len(first)  # one device per claim
    assert audit(resource_api, ns, nodes) == []

    # The first wave goes; the waiting pods take its place.
    delete_pods(core, ns, list(first))
    left = nodes.pods - len(first)
    second = settled(core, resource_api, nodes, ns, left)  # the waiting pods admitted
    assert not set(second) & set(first)
    assert audit(resource_api, ns, nodes) == []

    delete_pods(core, ns, [p.metadata.name for p in core.list_namespaced_pod(ns).items])
    wait_for("every pod gone", lambda: not core.list_namespaced_pod(ns).items, timeout=120)
    wait_for(
        "the claims from templates gone with their pods",
        lambda: not resource_api.list_namespaced_resource_claim(ns).items,
        timeout=60,
    )
    assert leftovers(nodes) == []
    wait_for("the fabric GPUs detached", lambda: not env.fabric.connections(), timeout=60)
