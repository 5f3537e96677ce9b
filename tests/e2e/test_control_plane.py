"""The local control plane is the real thing: allocation, validation, constraints.

Why this module exists: every cluster-level claim patchbay makes rests on the
real apiserver validating what we publish, the real controller-manager
creating claims from templates and the real scheduler allocating from our
slices. These tests prove the local cluster (tests/harness/cluster.py) provides all
of that, and that it starts and stops cleanly.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch

from tests.cluster_fixtures import RUN_DIR, record_startup
from tests.e2e.helpers import delete_quietly, device_class, make_node, pod_body, unique, wait_for
from tests.harness import cluster as localk8s
from tests.harness.cluster_proc import pid_alive

pytestmark = pytest.mark.cluster


def slice_body(
    name: str, driver: str, node: str, devices: list[dict[str, Any]], pool: str | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture
def dra_objects(core: client.CoreV1Api, resource_api: client.ResourceV1Api) -> Any:
    """Unique driver/class/node names; cluster-scoped objects removed afterwards."""
    names = {"driver": f"{unique('d')}.e2e.patchbay.dev", "node": unique("node")}
    names["class"] = names["driver"]
    slices: list[str] = []
    yield names, slices
    for s in slices:
        delete_quietly(resource_api.delete_resource_slice, s)
    delete_quietly(resource_api.delete_device_class, names["class"])
    delete_quietly(core.delete_node, names["node"])


def test_template_claim_is_created_allocated_and_pod_bound(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str, dra_objects: Any
) -> None:
    names, slices = dra_objects
    driver, node = names["driver"], names["node"]
    resource_api.create_device_class(device_class(names["class"], driver))
    make_node(core, node)
    devices = [{"name": "dev-0"}, {"name": "dev-1"}]
    resource_api.create_resource_slice(slice_body(node, driver, node, devices))
    slices.append(node)
    template = {
        "metadata": {"name": "tmpl"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "one", "exactly": {"deviceClassName": names["class"]}}]
                }
            }
        },
    }
    resource_api.create_namespaced_resource_claim_template(namespace, template)
    core.create_namespaced_pod(namespace, pod_body("p", {"resourceClaimTemplateName": "tmpl"}))

    pod = wait_for(
        "the scheduler to bind the pod",
        lambda: (p := core.read_namespaced_pod("p", namespace)).spec.node_name and p,
    )
    assert pod.spec.node_name == node
    statuses = pod.status.resource_claim_statuses or []
    assert [s.name for s in statuses] == ["dev"], "controller-manager did not record the claim"
    claim = resource_api.read_namespaced_resource_claim(statuses[0].resource_claim_name, namespace)
    assert claim.metadata.owner_references[0].name == "p"
    assert claim.metadata.owner_references[0].uid == pod.metadata.uid
    results = claim.status.allocation.devices.results
    assert len(results) == 1
    assert results[0].driver == driver
    assert results[0].pool == node
    assert results[0].device in {"dev-0", "dev-1"}
    assert [r.uid for r in claim.status.reserved_for] == [pod.metadata.uid]


def _pair_claim(name: str, device_class_name: str, driver: str) -> dict[str, Any]:
    def request(kind: str) -> dict[str, Any]:
        cel = f'device.attributes["{driver}"].kind == "{kind}"'
        return {
            "name": kind,
            "exactly": {
                "deviceClassName": device_class_name,
                "selectors": [{"cel": {"expression": cel}}],
            },
        }

    return {
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [request("gpu"), request("nic")],
                "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": f"{driver}/root"}],
            }
        },
    }


def _device(name: str, kind: str, root: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"kind": {"string": kind}, "root": {"string": root}}}


def test_match_attribute_is_enforced(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, namespace: str, dra_objects: Any
) -> None:
    names, slices = dra_objects
    driver, node = names["driver"], names["node"]
    resource_api.create_device_class(device_class(names["class"], driver))
    make_node(core, node)
    mismatched = [_device("gpu-a", "gpu", "r1"), _device("nic-a", "nic", "r2")]
    resource_api.create_resource_slice(slice_body(f"{node}-a", driver, node, mismatched, "pool-a"))
    slices.append(f"{node}-a")
    resource_api.create_namespaced_resource_claim(
        namespace, _pair_claim("pair", names["class"], driver)
    )
    core.create_namespaced_pod(namespace, pod_body("p", {"resourceClaimName": "pair"}))

    def unschedulable() -> bool:
        pod = core.read_namespaced_pod("p", namespace)
        return any(
            c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or []
        )

    wait_for("the scheduler to report the pod unschedulable", unschedulable, timeout=30)
    assert core.read_namespaced_pod("p", namespace).spec.node_name is None
    assert resource_api.read_namespaced_resource_claim("pair", namespace).status.allocation is None

    matching = [_device("gpu-b", "gpu", "r3"), _device("nic-b", "nic", "r3")]
    resource_api.create_resource_slice(slice_body(f"{node}-b", driver, node, matching, "pool-b"))
    slices.append(f"{node}-b")
    pod = wait_for(
        "the pod to be bound once a matching pair exists",
        lambda: (p := core.read_namespaced_pod("p", namespace)).spec.node_name and p,
        timeout=90,
    )
    assert pod.spec.node_name == node
    results = resource_api.read_namespaced_resource_claim("pair", namespace).status.allocation
    assert sorted((r.pool, r.device) for r in results.devices.results) == [
        ("pool-b", "gpu-b"),
        ("pool-b", "nic-b"),
    ]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(proc.name))
    return found


def _watch_namespaces(kubeconfig: Path, opened: threading.Event) -> None:
    """Hold a watch open, as a test's watch thread or a user's `kubectl get -w` does,
    until the apiserver ends it."""
    api = config.new_client_from_config(config_file=str(kubeconfig))
    # The server going away ends it, cleanly or with a broken connection.
    with contextlib.suppress(Exception), contextlib.closing(api):
        for _ in watch.Watch().stream(client.CoreV1Api(api).list_namespace, timeout_seconds=600):
            opened.set()


@pytest.mark.usefixtures("local_cluster")
def test_second_cluster_starts_and_tears_down_without_leftovers(
    local_cluster: localk8s.LocalCluster,
) -> None:
    run_dir = RUN_DIR / "second"
    second = localk8s.LocalCluster(run_dir, local_cluster.binaries)
    opened = threading.Event()
    try:
        second.up()
        assert second.startup_seconds is not None
        record_startup("second cluster", second.startup_seconds)
        pids = second.pids()
        assert set(pids) == set(localk8s.BINARIES)
        assert all(pid_alive(pid) for pid in pids.values())
        assert _processes_mentioning(str(run_dir)), "components should reference their run dir"
        args = (second.kubeconfig, opened)
        threading.Thread(target=_watch_namespaces, args=args, daemon=True).start()
        assert opened.wait(60), "the namespace watch sent nothing"
    finally:
        killed = second.down()
    # An open watch must not keep kube-apiserver past SIGTERM (issue 33).
    assert killed == [], f"ignored SIGTERM with a client watch open, killed: {killed}"
    assert not [pid for pid in pids.values() if pid_alive(pid)]
    assert _processes_mentioning(str(run_dir)) == []
    assert second.pids() == {}
