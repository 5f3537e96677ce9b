"""GPU + VF pairing on one PCIe root, on the real control plane.

One simulated node of two root complexes, each a switch with 2 H100 and a
NIC PF; the plugin's --vf-config selects both PFs with numVfs 4, so the
plugin itself resizes them (8 -> 0 -> 4 through sriov_numvfs). The real
scheduler allocates GPU + VF claims with matchAttribute on pcieRoot; the
node agent prepares them through our socket. The malformed-VfConfig case
plays the kubelet itself, with claims allocated by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client

from plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.pairing_claims import (
    ROOT_A,
    ROOT_B,
    allocated,
    devices,
    kinds,
    make_template,
    pair_spec,
    request,
    root_of,
)
from tests.e2e.pods import claim_of, gone, phase, pod, running
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)
from tests.kube.claims import allocated_claim

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim(
    local_cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimNode]:
    build_nvml_mock()
    apply_plugin_rbac(local_cluster.kubeconfig)
    apply_deviceclasses(resource_api)
    vf_config = tmp_path_factory.mktemp("vf") / "vf.yaml"
    vf_config.write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(
        local_cluster, unique("pair"), "2x-h100-nic", kubeconfig, (f"--vf-config={vf_config}",)
    ).start()
    try:

        def published() -> bool:
            node.check_alive()
            return kinds(devices(resource_api, node.name)) == {"gpu": 4, "vf": 8}

        wait_for("4 GPUs and 8 VFs published", published, timeout=90)
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


def test_vf_slices_carry_their_pfs_root(sim: SimNode, resource_api: client.ResourceV1Api) -> None:
    devs = devices(resource_api, sim.name)
    by_root: dict[str, dict[str, int]] = {}
    for d in devs.values():
        counts = by_root.setdefault(root_of(d), {})
        counts[d.attributes["type"].string] = counts.get(d.attributes["type"].string, 0) + 1
    assert by_root == {ROOT_A: {"gpu": 2, "vf": 4}, ROOT_B: {"gpu": 2, "vf": 4}}
    vf = devs["vf-0000-1a-00-2"]
    assert vf.attributes["pfName"].string == "ens0f0np0"
    assert vf.attributes["pfPciBusID"].string == "0000:1a:00.0"
    assert vf.attributes["vfIndex"].int == 0
    assert vf.attributes["resource.kubernetes.io/numaNode"].int == 0
    # The plugin shrank the PFs from 8 VFs to the configured 4.
    assert not sim.host.tree.exists("0000:1a:00.6")


def test_pairs_share_a_root_and_wait_for_one(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, node = namespace, sim.name
    devs = devices(resource_api, node)
    pair = make_template(resource_api, ns, "pair", pair_spec())
    for i in range(2):
        pod(core, ns, f"pair-{i}", node, pair)
    for i in range(2):
        running(core, ns, f"pair-{i}")
        got = allocated(claim_of(core, resource_api, ns, f"pair-{i}"))
        assert root_of(devs[got["gpu"]]) == root_of(devs[got["nic"]]), got
    for i in range(2):
        gone(core, ns, f"pair-{i}")

    # Root A: all 4 VFs taken; root B: both GPUs taken. No root has a pair.
    vf_hold = make_template(
        resource_api, ns, "vfs-a", {"requests": [request("nic", "vf.patchbay.dev", 4, ROOT_A)]}
    )
    gpu_hold = make_template(
        resource_api, ns, "gpus-b", {"requests": [request("gpu", "gpu.patchbay.dev", 2, ROOT_B)]}
    )
    pod(core, ns, "hold-vfs", node, vf_hold)
    pod(core, ns, "hold-gpus", node, gpu_hold)
    running(core, ns, "hold-vfs")
    running(core, ns, "hold-gpus")
    pod(core, ns, "waiting", node, pair)

    def unschedulable() -> Any:
        conds = core.read_namespaced_pod("waiting", ns).status.conditions or []
        return next(
            (c for c in conds if c.type == "PodScheduled" and c.reason == "Unschedulable"), None
        )

    cond = wait_for("scheduler to call the pair pod unschedulable", unschedulable, timeout=60)
    assert "claim" in cond.message, cond.message
    assert phase(core, ns, "waiting") == "Pending"
    assert sim.agent.pod_record(ns, "waiting") is None
    prepared = {p.name for p in sim.agent.cdi_root.glob("*.json")}
    assert len(prepared) == 2, prepared  # only the two holders' claims

    gone(core, ns, "hold-vfs")
    running(core, ns, "waiting")
    got = allocated(claim_of(core, resource_api, ns, "waiting"))
    assert root_of(devs[got["gpu"]]) == root_of(devs[got["nic"]]) == ROOT_A
    for name in ("waiting", "hold-gpus"):
        gone(core, ns, name)


def test_vfio_mode_binds_while_running_and_restores(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns = namespace
    params = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig", "mode": "vfio-pci"}
    config = [{"requests": ["nic"], "opaque": {"driver": "patchbay.dev", "parameters": params}}]
    tmpl = make_template(resource_api, ns, "pair-vfio", pair_spec(config))
    pod(core, ns, "vfio", sim.name, tmpl)
    running(core, ns, "vfio")
    vf = devices(resource_api, sim.name)[allocated(claim_of(core, resource_api, ns, "vfio"))["nic"]]
    bdf = vf.attributes["resource.kubernetes.io/pciBusID"].string
    assert sim.host.tree.driver_of(bdf) == "vfio-pci"
    group = (sim.host.tree.path_of(bdf) / "iommu_group").resolve().name
    record = sim.agent.pod_record(ns, "vfio")
    assert record is not None
    containers = record["containers"]
    assert isinstance(containers, dict)
    (container,) = containers.values()
    paths = {n["path"] for n in container["deviceNodes"]}
    assert {f"/dev/vfio/{group}", "/dev/vfio/vfio"} <= paths
    gone(core, ns, "vfio")
    assert sim.host.tree.driver_of(bdf) == "mlx5_core"


def test_malformed_vf_config_fails_only_that_claim(
    sim: SimNode, resource_api: client.ResourceV1Api, namespace: str
) -> None:
    ns, node = namespace, sim.name
    bad_params = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig", "mode": "sriov"}
    bad_cfg = [
        {
            "source": "FromClaim",
            "requests": ["req-0"],
            "opaque": {"driver": "patchbay.dev", "parameters": bad_params},
        }
    ]
    good = allocated_claim(resource_api, ns, "good", node, ["gpu-0", "vf-0000-1a-00-3"])
    bad = allocated_claim(resource_api, ns, "bad", node, ["vf-0000-8a-00-3"], config=bad_cfg)
    (sock,) = (sim.agent.plugins_dir / "patchbay.dev").glob("dra*.sock")
    claims = [("good", good), ("bad", bad)]
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        req = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, name=n, uid=u) for n, u in claims]
        )
        res = stub.NodePrepareResources(req, timeout=45).claims
        assert res[good].error == ""
        assert sorted(d.device_name for d in res[good].devices) == ["gpu-0", "vf-0000-1a-00-3"]
        assert "invalid VfConfig" in res[bad].error and "field mode" in res[bad].error
        assert not (sim.agent.cdi_root / f"k8s.patchbay.dev-claim_{bad}.json").exists()
        unreq = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, name=n, uid=u) for n, u in claims]
        )
        done = stub.NodeUnprepareResources(unreq, timeout=45).claims
        assert done[good].error == "" and done[bad].error == ""


@pytest.fixture(scope="module")
def numa_sim(
    local_cluster: LocalCluster,
    sim: SimNode,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimNode]:
    """Two roots on NUMA node 0; only the first has a NIC."""
    vf_config = tmp_path_factory.mktemp("vf-numa") / "vf.yaml"
    vf_config.write_text("pfs:\n  - name: ens0f0np0\n")
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(
        local_cluster, unique("numa"), "numa-shared-nic", kubeconfig, (f"--vf-config={vf_config}",)
    ).start()
    try:
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


def test_numa_fallback_example_prefers_the_root(
    numa_sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, node = namespace, numa_sim.name

    def published() -> dict[str, Any] | None:
        numa_sim.check_alive()
        found = devices(resource_api, node)
        return found if kinds(found) == {"gpu": 4, "vf": 4} else None

    devs = wait_for("4 GPUs and 4 VFs published", published, timeout=90)
    example = REPO / "deviceclasses" / "examples" / "gpu-vf-numa-fallback.yaml"
    doc = next(
        d for d in yaml.safe_load_all(example.read_text()) if d["kind"] == "ResourceClaimTemplate"
    )
    resource_api.create_namespaced_resource_claim_template(ns, doc)
    tmpl = doc["metadata"]["name"]
    hold = make_template(
        resource_api, ns, "gpus-a", {"requests": [request("gpu", "gpu.patchbay.dev", 2, ROOT_A)]}
    )
    pod(core, ns, "hold", node, hold)
    running(core, ns, "hold")
    pod(core, ns, "fallback", node, tmpl)
    running(core, ns, "fallback")
    got = allocated(claim_of(core, resource_api, ns, "fallback"))
    assert set(got) == {"gpu", "nic/same-numa"}, got
    gpu, nic = devs[got["gpu"]], devs[got["nic/same-numa"]]
    assert (root_of(gpu), root_of(nic)) == ("pci0000:45", ROOT_A)
    numa = "resource.kubernetes.io/numaNode"
    assert gpu.attributes[numa].int == nic.attributes[numa].int == 0

    gone(core, ns, "hold")
    pod(core, ns, "aligned", node, tmpl)
    running(core, ns, "aligned")
    got = allocated(claim_of(core, resource_api, ns, "aligned"))
    assert set(got) == {"gpu", "nic/same-root"}, got
    assert root_of(devs[got["gpu"]]) == root_of(devs[got["nic/same-root"]]) == ROOT_A
    for name in ("fallback", "aligned"):
        gone(core, ns, name)


def test_one_root_example_puts_all_four_devices_on_one_root(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    devs = devices(resource_api, sim.name)
    example = REPO / "deviceclasses" / "examples" / "two-gpus-two-vfs-one-root.yaml"
    doc = next(
        d for d in yaml.safe_load_all(example.read_text()) if d["kind"] == "ResourceClaimTemplate"
    )
    resource_api.create_namespaced_resource_claim_template(namespace, doc)
    pod(core, namespace, "quad", sim.name, doc["metadata"]["name"])
    running(core, namespace, "quad")
    claim = claim_of(core, resource_api, namespace, "quad")
    results = claim.status.allocation.devices.results
    assert sorted(r.request for r in results) == ["gpus", "gpus", "nics", "nics"]
    roots = {root_of(devs[r.device]) for r in results}
    assert len(roots) == 1, roots
    gone(core, namespace, "quad")
