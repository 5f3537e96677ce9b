"""NVMe drives and CXL Type 3 memory from the fabric, on the real control plane.

A CXL fabric (tests/e2e/conftest.py builds the env, this module's layout):
switch sw0 holds gpu-0 and the NVMe drive nvme-0 behind adapter0 (root
pci0000:15) of both nodes, sw1 holds gpu-1 and the CXL memory expander cxl-0
behind adapter1 (root pci0000:85). A pod asking for ``nvme.patchbay.dev`` or
``cxl-memory.patchbay.dev`` gets the device attached to its node with one
attach request; the node agent's CDI resolution gives the container the
namespace's block and generic devices or the devdax device, with their env;
the claim names the device by its serial and, for CXL memory, by the memdev
the node reports (its BDF, and the node's name of it). A detach the host
refuses (CXL memory in use) keeps the device attached and says why until
the memory is released. Each attach dialect: a CXL attach is a Memory
Connection in one and a Zone PATCH in the other. The controller runs in the
default shape (per-domain); the per-node examples' test switches it to
per-node (the per-domain examples run in tests/e2e/test_fabric_domain_e2e.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.fabric_devices.naming import (
    NodeFabric,
    cxl_bdf_of,
    cxl_serial_of,
    in_fabric_pool,
    variant_name,
)
from tests.e2e.fabric_helpers import (
    DIALECTS,
    Env,
    FabricLayout,
    SwitchLayout,
    attr,
    fabric_pool,
    restart,
    running,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.kubectl_views import fabric
from tests.e2e.pods import claim_of, gone, pod
from tests.e2e.tenants import container_record
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster
FABRIC_DIALECTS = DIALECTS
LAYOUT = FabricLayout(
    (
        SwitchLayout("sw0", "adapter0", gpus=("gpu-0",), nvmes=("nvme-0",)),
        SwitchLayout("sw1", "adapter1", gpus=("gpu-1",), cxlmems=("cxl-0",)),
    ),
    type="CXL",
)
CXL_BYTES = 64 << 30  # tests/harness/fabricsim.switch's CXL memory size
PER_NODE = Path(__file__).resolve().parents[2] / "deviceclasses" / "examples" / "per-node"


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return LAYOUT


def request(cls: str, name: str = "dev") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls}}


def asked(env: Env, device: str, node: str, since: int) -> int:
    """Attach requests for ``device`` on ``node`` the fabric received after
    the first ``since`` (the audit), each in the env's dialect."""
    new = env.fabric.attach_requests()[since:]
    assert {r["dialect"] for r in new} <= {env.dialect}, new
    return sum(r["target"] == device and r["initiator"].startswith(f"{node}/") for r in new)


def report(core: Any, node: str) -> NodeFabric:
    """What the node's plugin reports (its Node annotation)."""
    meta = core.read_node(node).metadata
    seen = NodeFabric.from_node({"metadata": {"annotations": meta.annotations}})
    assert seen is not None, f"{node} reports no fabric annotation"
    return seen


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in container["env"])


def ready_entry(claim: Any) -> Any:
    """The claim's one fabric device status entry, ready."""
    (entry,) = [d for d in claim.status.devices or [] if in_fabric_pool(d.pool, "fabric")]
    assert {c.type: c.status for c in entry.conditions} == {"FabricDeviceReady": "True"}
    return entry


def attached_and_running(
    env: Env, resource_api: Any, core: Any, ns: str, name: str, cls: str, sim: SimNode
) -> tuple[Any, dict[str, Any]]:
    """A pod on ``sim`` asking for one device of ``cls`` runs with it attached
    by one request; its claim and its container's record."""
    since = len(env.fabric.attach_requests())
    tmpl = template(resource_api, ns, name, [request(cls)])
    pod(core, ns, name, sim.name, tmpl)
    running(env, core, ns, name)
    claim = claim_of(core, resource_api, ns, name)
    (result,) = claim.status.allocation.devices.results
    assert in_fabric_pool(result.pool, "fabric"), result  # its domain pool (or per-node)
    device = attr(fabric_pool(resource_api)[result.device], "fabricDevice")
    assert asked(env, device, sim.name, since) == 1, env.fabric.attach_requests()
    return claim, container_record(sim, ns, name)


def released(env: Env, resource_api: Any, core: Any, node: str, device: str) -> None:
    """``device`` detached, the node no longer reports it, the pool whole again.

    The node's report follows the host's remove uevent and the plugin's rescan,
    the pool the controller's detach: neither waits for the other, so each is
    waited for."""
    wait_for(f"{device} detached", lambda: device not in env.fabric.connections(), timeout=60)
    wait_for(
        "the pool whole again",
        lambda: len(fabric_pool(resource_api)) == env.pool_size,
        timeout=60,
    )

    def clean() -> bool:
        seen = report(core, node)
        return (dict(seen.nvme), dict(seen.cxlmem), set(seen.busy)) == ({}, {}, set())

    wait_for(
        f"{node} no longer reports {device}", lambda: env.check_alive() and clean(), timeout=60
    )


def test_an_nvme_drive_from_the_fabric(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    sim = env.nodes[0]
    claim, container = attached_and_running(
        env, resource_api, core, namespace, "drive", "nvme.patchbay.dev", sim
    )
    assert env.fabric.connections()["nvme-0"][:2] == (sim.name, "adapter0")
    (serial,) = report(core, sim.name).nvme  # what the node sees under adapter0
    assert ready_entry(claim).data == {
        "fabricDevice": "nvme-0", "serial": serial, "adapter": "adapter0",
        "preparedAs": variant_name(serial, sim.name, "adapter0", "nvme"),
    }  # fmt: skip
    nodes = sorted(n["path"] for n in container["deviceNodes"])
    assert len(nodes) == 2 and re.fullmatch(r"/dev/ng(\d+)n1", nodes[0]), nodes
    ctrl = re.fullmatch(r"/dev/ng(\d+)n1", nodes[0]).group(1)  # type: ignore[union-attr]
    assert nodes[1] == f"/dev/nvme{ctrl}n1"
    got = env_of(container)
    assert got["PATCHBAY_NVME_DEVICES"] == f"/dev/nvme{ctrl}n1"
    assert got["PATCHBAY_NVME_SERIAL_0"] == serial
    gone(core, namespace, "drive")
    released(env, resource_api, core, sim.name, "nvme-0")


def test_cxl_memory_from_the_fabric(env: Env, resource_api: Any, core: Any, namespace: str) -> None:
    sim = env.nodes[1]
    claim, container = attached_and_running(
        env, resource_api, core, namespace, "tier", "cxl-memory.patchbay.dev", sim
    )
    assert env.fabric.connections()["cxl-0"][:2] == (sim.name, "adapter1")
    (key,) = report(core, sim.name).cxlmem  # the node's key: <serial>@<memdev BDF>
    serial, bdf = cxl_serial_of(key), cxl_bdf_of(key)
    assert ready_entry(claim).data == {
        "fabricDevice": "cxl-0", "serial": serial, "adapter": "adapter1",
        "resource.kubernetes.io/pciBusID": bdf,
        "preparedAs": variant_name(key, sim.name, "adapter1", "cxlmem"),
    }  # fmt: skip
    (dax,) = [n["path"] for n in container["deviceNodes"]]
    assert re.fullmatch(r"/dev/dax\d+\.0", dax), dax
    node_of_memory = (sim.host.sysfs_root / "bus/dax/devices" / dax[5:] / "target_node").read_text()
    got = env_of(container)
    assert got["PATCHBAY_CXL_DEVICES"] == dax
    assert got["PATCHBAY_CXL_SIZE_0"] == str(CXL_BYTES)
    assert got["PATCHBAY_CXL_NUMA_NODE_0"] == node_of_memory.strip()
    assert got["PATCHBAY_CXL_SERIAL_0"] == serial
    gone(core, namespace, "tier")
    released(env, resource_api, core, sim.name, "cxl-0")
    assert not (sim.host.sysfs_root / "bus/dax/devices" / dax[5:]).exists()


def test_a_detach_refused_while_the_memory_is_in_use_waits_for_it(
    env: Env, resource_api: Any, core: Any, namespace: str, local_cluster: LocalCluster
) -> None:
    sim = env.nodes[0]
    claim, container = attached_and_running(
        env, resource_api, core, namespace, "busy", "cxl-memory.patchbay.dev", sim
    )
    (dax,) = [n["path"][5:] for n in container["deviceNodes"]]
    on_host = sim.host.sysfs_root / "bus/dax/devices" / dax
    name = claim.metadata.name
    env.fabric.faults(devices={"cxl-0": {"memoryInUse": True}})
    try:
        gone(core, namespace, "busy")  # unprepared: the controller detaches, the host refuses
        (refused, *_) = wait_for(
            "DetachFailed on the claim",
            lambda: env.check_alive() and events_about(core, namespace, name, "DetachFailed"),
            timeout=60,
        )
        assert refused.type == "Warning" and "in use" in refused.message, refused.message
        assert "cxl-0" in refused.message
        # Nothing lost: still attached to the node, the memory still on the host.
        assert env.fabric.connections()["cxl-0"][:2] == (sim.name, "adapter1")
        assert on_host.exists()
        assert events_about(core, namespace, name, "Detached") == []
        view = fabric(local_cluster)["cxl-0"]  # kubectl patchbay fabric says why
        assert view["attached"] == {"node": sim.name, "adapter": "adapter1", "busy": False}
        assert view["why"]["reason"] == "DetachFailed" and "in use" in view["why"]["message"]
    finally:
        env.fabric.faults(devices={"cxl-0": {"memoryInUse": False}})
    released(env, resource_api, core, sim.name, "cxl-0")
    wait_for("Detached Event", lambda: events_about(core, namespace, name, "Detached"), timeout=30)
    assert not on_host.exists()


def example(resource_api: Any, core: Any, ns: str, file: str) -> str:
    """Create the example's claim template and pod in ``ns``; the pod's name."""
    template_doc, pod_doc = yaml.safe_load_all((PER_NODE / file).read_text())
    resource_api.create_namespaced_resource_claim_template(ns, template_doc)
    core.create_namespaced_pod(ns, pod_doc)
    return str(pod_doc["metadata"]["name"])


def test_the_per_node_gpudirect_storage_and_cxl_tier_examples_run(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """deviceclasses/examples/per-node/'s GDS and CXL tier, the controller
    switched to ``--fabric-pool-shape=per-node`` (and back after)."""
    plain, shape = env.ctl.extra, "--fabric-pool-shape=per-node"
    env.ctl.extra, env.per_domain = (*plain, shape), False
    restart(env, "controller-per-node")
    try:
        wait_for("the per-node pool", lambda: env.check_alive() and
                 len(fabric_pool(resource_api)) == env.pool_size, timeout=60)  # fmt: skip
        per_node_examples(env, resource_api, core, namespace)
    finally:
        env.ctl.extra, env.per_domain = plain, True
        restart(env, "controller-per-domain")
    wait_for("the domain pools", lambda: env.check_alive() and
             len(fabric_pool(resource_api)) == env.pool_size, timeout=60)  # fmt: skip


def per_node_examples(env: Env, resource_api: Any, core: Any, namespace: str) -> None:
    ns = namespace
    since = len(env.fabric.attach_requests())
    gds = example(resource_api, core, ns, "gpu-nvme-gds.yaml")
    tier = example(resource_api, core, ns, "gpu-cxl-memory.yaml")
    for name, pair in ((gds, ("gpu-0", "nvme-0")), (tier, ("gpu-1", "cxl-0"))):
        running(env, core, ns, name)
        claim = claim_of(core, resource_api, ns, name)
        results = claim.status.allocation.devices.results
        assert {r.pool for r in results} == {"fabric"}
        pool = fabric_pool(resource_api)
        variants = [pool[r.device] for r in results]
        assert sorted(attr(v, "fabricDevice") for v in variants) == sorted(pair)
        # One node, one adapter: the pair shares the adapter's root complex.
        conns = env.fabric.connections()
        node = core.read_namespaced_pod(name, ns).spec.node_name
        adapter = "adapter0" if name == gds else "adapter1"
        assert {conns[d][:2] for d in pair} == {(node, adapter)}
        assert len({attr(v, "resource.kubernetes.io/pcieRoot") for v in variants}) == 1
        assert all(asked(env, d, node, since) == 1 for d in pair), env.fabric.attach_requests()
        sim = next(n for n in env.nodes if n.name == node)
        got = env_of(container_record(sim, ns, name))
        assert "NVIDIA_VISIBLE_DEVICES" in got
        assert ("PATCHBAY_NVME_DEVICES" if name == gds else "PATCHBAY_CXL_DEVICES") in got
    gone(core, ns, gds, tier)
    wait_for("all detached", lambda: not env.fabric.connections(), timeout=60)
    wait_for(
        "the pool whole again",
        lambda: len(fabric_pool(resource_api)) == env.pool_size,
        timeout=60,
    )
