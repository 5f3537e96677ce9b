"""Per-PF VF bandwidth on the real scheduler (default 1.37 gates, no alpha).

One simulated node of two root complexes, each a switch with 2 H100 and a
100 Gb/s NIC PF (the simulated NIC's ``net/<if>/speed``). The plugin's
--vf-config gives both PFs 4 VFs; PF A (root pci0000:15) is bandwidth
managed with tiers 10G/25G/40G, PF B is not. Two 40 Gb/s VF claims on PF A
run, a third is refused by the scheduler (PodScheduled False, its own
message) while two VFs of PF A are still free and a 10 Gb/s claim still
fits: the counters, not the VF count, refuse it. The shipped GPU + 40 Gb/s
VF pairing example runs with both on one pcieRoot, next to the plain
GPU + VF pairing on PF B.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.pods import claim_of, gone, pod, refused, running
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "deviceclasses" / "examples"
ROOT = "resource.kubernetes.io/pcieRoot"
PF_A, ROOT_A, ROOT_B = "0000:1a:00.0", "pci0000:15", "pci0000:85"
VF_CONFIG = f"""\
pfs:
  - pciAddress: '{PF_A}'
    numVfs: 4
    bandwidthTiers: [10G, 25G, 40G]
  - vendorID: '15b3'
    numVfs: 4
"""


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
    vf_config.write_text(VF_CONFIG)
    kubeconfig = local_cluster.kubeconfig_for(*PLUGIN_IDENTITY)
    node = SimNode(
        local_cluster, unique("vfbw"), "2x-h100-nic", kubeconfig, (f"--vf-config={vf_config}",)
    ).start()
    try:
        # 4 GPUs, 4 VFs x 3 tiers on PF A, 4 plain VFs on PF B.
        def published() -> bool:
            node.check_alive()
            return len(devices(resource_api, node)) == 4 + 12 + 4

        wait_for("the node's GPUs and VF tiers published", published, timeout=90)
        yield node
    finally:
        node.stop()
        delete_quietly(core.delete_node, node.name)


def slices(resource_api: client.ResourceV1Api, node: SimNode) -> list[Any]:
    query = f"spec.nodeName={node.name}"
    return list(resource_api.list_resource_slice(field_selector=query).items)


def devices(resource_api: client.ResourceV1Api, node: SimNode) -> dict[str, Any]:
    return {d.name: d for s in slices(resource_api, node) for d in (s.spec.devices or [])}


def nic_request(bandwidth: str | None, pf: str | None = PF_A) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "vf.patchbay.dev"}
    if pf:
        cel = f'device.attributes["patchbay.dev"].pfPciBusID == "{pf}"'
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    if bandwidth:
        exactly["capacity"] = {"requests": {"bandwidth": bandwidth}}
    return {"name": "nic", "exactly": exactly}


def template(resource_api: client.ResourceV1Api, ns: str, name: str, spec: dict[str, Any]) -> str:
    body = {"metadata": {"name": name}, "spec": {"spec": {"devices": spec}}}
    resource_api.create_namespaced_resource_claim_template(ns, body)
    return name


def allocated(
    core: client.CoreV1Api, resource_api: client.ResourceV1Api, ns: str, name: str
) -> dict[str, str]:
    claim = claim_of(core, resource_api, ns, name)
    return {r.request: r.device for r in claim.status.allocation.devices.results}


def env_of(sim: SimNode, ns: str, name: str) -> dict[str, str]:
    record = sim.agent.pod_record(ns, name)
    assert record is not None
    containers = record["containers"]
    assert isinstance(containers, dict)
    (container,) = containers.values()
    return dict(e.split("=", 1) for e in container["env"])


def prefix(vf_device: Any) -> str:
    bdf = str(vf_device.attributes["resource.kubernetes.io/pciBusID"].string)
    return "PATCHBAY_VF_" + bdf.upper().replace(":", "_").replace(".", "_")


def test_pf_publishes_its_line_rate_as_a_counter_set(
    sim: SimNode, resource_api: client.ResourceV1Api
) -> None:
    sets = {c.name: c for s in slices(resource_api, sim) for c in (s.spec.shared_counters or [])}
    assert sets["pf-0000-1a-00-0"].counters["bandwidth"].value == "100G"
    assert sorted(sets["pf-0000-1a-00-0-vfs0"].counters) == [f"vf-{i}" for i in range(4)]
    tier = devices(resource_api, sim)["vf-0000-1a-00-2-40g"]
    assert tier.capacity["bandwidth"].value == "40G"
    assert {c.counter_set for c in tier.consumes_counters} == {
        "pf-0000-1a-00-0",
        "pf-0000-1a-00-0-vfs0",
    }


def test_third_40g_vf_on_a_100g_pf_is_refused_by_the_scheduler(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, node = namespace, sim.name
    devs = devices(resource_api, sim)
    bw40 = template(resource_api, ns, "bw40", {"requests": [nic_request("40G")]})
    for name in ("bw40-a", "bw40-b"):
        pod(core, ns, name, node, bw40)
    got = []
    for name in ("bw40-a", "bw40-b"):
        running(core, ns, name, alive=sim.check_alive)
        device = allocated(core, resource_api, ns, name)["nic"]
        assert device.endswith("-40g"), device  # the smallest tier that holds 40G
        got.append(device)
        assert env_of(sim, ns, name)[f"{prefix(devs[device])}_BANDWIDTH_MBPS"] == "40000"
    assert len({devs[d].attributes["vfIndex"].int for d in got}) == 2

    pod(core, ns, "bw40-c", node, bw40)
    message = refused(core, ns, "bw40-c")
    assert "cannot allocate all claims" in message, message
    assert sim.agent.pod_record(ns, "bw40-c") is None

    # Two VFs of PF A are still free: 20G of line rate is what is missing.
    bw10 = template(resource_api, ns, "bw10", {"requests": [nic_request("10G")]})
    pod(core, ns, "bw10", node, bw10)
    running(core, ns, "bw10", alive=sim.check_alive)
    assert allocated(core, resource_api, ns, "bw10")["nic"].endswith("-10g")
    assert core.read_namespaced_pod("bw40-c", ns).spec.node_name is None

    gone(core, ns, "bw40-a")  # 40G back: the third one runs
    running(core, ns, "bw40-c", alive=sim.check_alive)
    gone(core, ns, "bw40-b", "bw40-c", "bw10")


def test_gpu_and_bandwidth_vf_pair_on_one_root(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, node = namespace, sim.name
    devs = devices(resource_api, sim)
    doc = next(
        d
        for d in yaml.safe_load_all((EXAMPLES / "gpu-vf-bandwidth.yaml").read_text())
        if d["kind"] == "ResourceClaimTemplate"
    )
    example = template(resource_api, ns, doc["metadata"]["name"], doc["spec"]["spec"]["devices"])
    plain = template(
        resource_api,
        ns,
        "plain-pair",
        {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}},
                nic_request(None, pf=None),
            ],
            "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}],
        },
    )
    pod(core, ns, "pair-40g", node, example)
    running(core, ns, "pair-40g", alive=sim.check_alive)
    got = allocated(core, resource_api, ns, "pair-40g")
    gpu, nic = devs[got["gpu"]], devs[got["nic"]]
    assert gpu.attributes[ROOT].string == nic.attributes[ROOT].string == ROOT_A
    assert got["nic"].endswith("-40g")
    assert env_of(sim, ns, "pair-40g")[f"{prefix(nic)}_BANDWIDTH_MBPS"] == "40000"

    pod(core, ns, "pair-plain", node, plain)
    running(core, ns, "pair-plain", alive=sim.check_alive)
    got = allocated(core, resource_api, ns, "pair-plain")
    assert devs[got["gpu"]].attributes[ROOT].string == devs[got["nic"]].attributes[ROOT].string
    gone(core, ns, "pair-40g", "pair-plain")
