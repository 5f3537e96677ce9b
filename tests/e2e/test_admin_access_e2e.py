"""Admin access (``DRAAdminAccess``) on the real control plane (docs/tenants.md).

A monitoring claim with ``adminAccess: true``, in a namespace labelled
``resource.kubernetes.io/admin-access: "true"``, on a GPU a running pod
holds: the plugin prepares a read-only view, the holder's checkpoint record
and CDI spec stay as they were, and unpreparing either never disturbs the
other. On a dynamic-MIG node, what the 1.37.2 scheduler allows and that the
plugin never creates a MIG instance for a view.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.helpers import events_about, wait_for
from tests.e2e.plugin_nodes import node_devices
from tests.e2e.pods import gone, phase, pod, running
from tests.e2e.tenants import (
    claim_body,
    container_record,
    start_node,
    visible,
)
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster

ADMIN_LABEL = "resource.kubernetes.io/admin-access"


@pytest.fixture(scope="module")
def sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    yield from start_node(local_cluster, resource_api, core, "admin")


@pytest.fixture(scope="module")
def mig_sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    """2 x H100, dynamic MIG on GPU 0 only (``--mig-gpus=0``): its one 4g
    placement is then the pool's only 4g device, which a view can name (lean
    MIG devices publish no parent GPU or start to pin one by, issue 26)."""
    yield from start_node(local_cluster, resource_api, core, "admin-mig", "--mig-gpus=0", devices=3)


def test_admin_access_views_a_held_gpu_and_disturbs_nothing(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    resource_api.create_namespaced_resource_claim(namespace, claim_body("held"))
    pod(core, namespace, "holder", sim.name, {"resourceClaimName": "held"})
    running(core, namespace, "holder")
    held = resource_api.read_namespaced_resource_claim("held", namespace)
    (result,) = held.status.allocation.devices.results
    uuid_of = {d.name: d.attributes["uuid"].string for d in node_devices(resource_api, sim.name)}
    uuid = uuid_of[result.device]
    held_spec = sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{held.metadata.uid}.json"
    held_before, record_before = held_spec.read_text(), container_record(sim, namespace, "holder")
    selector = {"cel": {"expression": f'device.attributes["patchbay.dev"].uuid == "{uuid}"'}}

    def view(name: str) -> Path:
        body = claim_body(name, selectors=[selector], adminAccess=True)
        resource_api.create_namespaced_resource_claim(namespace, body)
        pod(core, namespace, name, sim.name, {"resourceClaimName": name})
        running(core, namespace, name)
        claim = resource_api.read_namespaced_resource_claim(name, namespace)
        (viewed,) = claim.status.allocation.devices.results
        assert viewed.device == result.device and viewed.admin_access
        assert visible(container_record(sim, namespace, name)) == [uuid]
        return sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{claim.metadata.uid}.json"

    view("monitor")
    assert held_spec.read_text() == held_before
    assert container_record(sim, namespace, "holder") == record_before
    gone(core, namespace, "monitor")
    assert phase(core, namespace, "holder") == "Running"
    assert held_spec.read_text() == held_before, "the view's unprepare left the holder alone"
    # And the other way round: the holder goes, the view stays as it was.
    spec = view("monitor-2")
    view_before = spec.read_text()
    gone(core, namespace, "holder")
    assert not held_spec.exists()
    assert spec.read_text() == view_before
    assert phase(core, namespace, "monitor-2") == "Running"
    gone(core, namespace, "monitor-2")


def mig_state(sim: SimNode) -> list[Any]:
    """Every GPU's MIG mode and instances, as the NVML mock holds them."""
    gpus = sorted(sim.host.nvml.read()["gpus"], key=lambda g: g["pci_bus_id"])
    return [(g["mig_current"], g["gpu_instances"]) for g in gpus]


def test_admin_access_to_mig_devices_never_changes_them(
    mig_sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    """Dynamic MIG partitions consume counters, and the 1.37.2 allocator checks
    counters for admin-access requests too (``checkAvailableCounters`` in
    k8s.io/dynamic-resource-allocation structured/internal/*/allocator_*.go):
    a view of a held partition is not allocated, and the holder runs on. A
    view of a partition nobody holds is allocated, and the plugin refuses it
    without creating the instance."""
    sim, ns = mig_sim, namespace
    core.patch_namespace(ns, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
    same = 'device.attributes["patchbay.dev"].profile == "4g.40gb"'  # one device in the pool
    held_body = claim_body("held", "mig.patchbay.dev", selectors=[{"cel": {"expression": same}}])
    resource_api.create_namespaced_resource_claim(ns, held_body)
    pod(core, ns, "holder", sim.name, {"resourceClaimName": "held"})
    running(core, ns, "holder")
    held = resource_api.read_namespaced_resource_claim("held", ns)
    (result,) = held.status.allocation.devices.results
    fours = [d.name for d in node_devices(resource_api, sim.name) if d.name.count("-4g-")]
    assert fours == [result.device] == ["gpu-0-mig-4g-40gb-0"]
    held_spec = sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{held.metadata.uid}.json"
    before, spec_before = mig_state(sim), held_spec.read_text()

    def view(name: str) -> None:
        body = claim_body(
            name, "mig.patchbay.dev", selectors=[{"cel": {"expression": same}}], adminAccess=True
        )
        resource_api.create_namespaced_resource_claim(ns, body)
        pod(core, ns, name, sim.name, {"resourceClaimName": name})

    view("monitor")
    (event, *_) = wait_for(
        "the view of a held partition left unallocated",
        lambda: [
            e
            for e in events_about(core, ns, "monitor")
            if "cannot allocate all claims" in (e.message or "")
        ],
        timeout=60,
    )
    assert event.reason == "FailedScheduling"
    assert resource_api.read_namespaced_resource_claim("monitor", ns).status.allocation is None
    assert mig_state(sim) == before and held_spec.read_text() == spec_before
    assert phase(core, ns, "holder") == "Running"
    core.delete_namespaced_pod("monitor", ns)
    gone(core, ns, "holder")
    after = mig_state(sim)
    assert after != before, "the holder's instance went with it"
    view("nobody")
    (event, *_) = wait_for(
        "the view of a partition nobody holds refused",
        lambda: [
            e for e in events_about(core, ns, "nobody") if "is not created" in (e.message or "")
        ],
        timeout=60,
    )
    assert event.reason == "FailedPrepareDynamicResources", event
    assert mig_state(sim) == after, "admin access never creates a MIG instance"
    core.delete_namespaced_pod("nobody", ns)
