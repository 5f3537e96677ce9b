"""Each fabric device published once (issue 34, step 2) on the real control plane.

The controller runs with ``--fabric-pool-shape=per-domain``; the harness
labels the nodes as provisioning would (tests/e2e/conftest.py). Each switch
is a reach domain: sw0 is wired to both nodes, sw1 to the first node only.
The real scheduler picks the node from the domain pools' node selectors and
waits in PreBind while the controller attaches through that node's adapter;
the node agents prepare through our plugins. Once per attach dialect.
The pairing examples (deviceclasses/examples/: fabric-gpu-vf-pair.yaml for
rdma-job, gpu-nvme-gds.yaml and gpu-cxl-memory.yaml) ask for the node's
fabric adapter beside their devices, each checked in the container's
environment; sw1 also holds an NVMe drive and CXL memory (so the fabric is
of type CXL).
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.controller.pool.domains import LABEL_PREFIX
from driver.cxl.serial import cxl_identity
from driver.fabric_devices.naming import (
    FAILED_CONDITION,
    READY_CONDITION,
    NodeFabric,
    adapter_device_name,
    cxl_serial_of,
)
from driver.pci.sysfs import pcie_root
from tests.e2e.fabric_helpers import (
    DIALECTS,
    ROOT,
    Env,
    FabricLayout,
    SwitchLayout,
    attr,
    claim_gone_or_free,
    conditions,
    fabric_pool,
    fabric_slices,
    gpu_request,
    restart,
    running,
    template,
)
from tests.e2e.helpers import events_about, wait_for
from tests.e2e.pairing_checks import (
    EXAMPLES,
    attach_requests,
    cxl_root,
    gpu_root,
    nvme_root,
    paired,
)
from tests.e2e.pods import claim_of, gone, pod, refused
from tests.e2e.tenants import container_record
from tests.harness.poll import WaitTimedOut

pytestmark = pytest.mark.cluster
RDMA_JOB = EXAMPLES / "fabric-gpu-vf-pair.yaml"
FABRIC_DIALECTS = DIALECTS
LAYOUT = FabricLayout(
    (
        SwitchLayout("sw0", "adapter0", gpus=("gpu-0", "gpu-1")),
        SwitchLayout(
            "sw1",
            "adapter1",
            gpus=("gpu-2",),
            nvmes=("nvme-0",),
            cxlmems=("cxl-0",),
            wired=(0,),
            room=2,  # adapter1 takes two devices (a pairing's), its virtual switch's vPPBs
        ),
    ),
    type="CXL",  # CXL memory needs it: the domains are cxl0.sw0 and cxl0.sw1
)


@pytest.fixture(scope="module")
def fabric_layout() -> FabricLayout:
    return LAYOUT


@pytest.fixture(scope="module")
def controller_args() -> tuple[str, ...]:
    return ("--fabric-pool-shape=per-domain",)


def on_switch(name: str, switch: str) -> dict[str, Any]:
    cel = f'device.attributes["patchbay.dev"].fabricSwitch == "{switch}"'
    return {"name": name, "exactly": {"deviceClassName": "gpu.patchbay.dev",
                                      "selectors": [{"cel": {"expression": cel}}]}}  # fmt: skip


def test_each_device_once_attached_through_the_picked_nodes_adapter(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    slices = fabric_slices(resource_api)
    held = {(s.spec.pool.name, attr(d, "fabricDevice")) for s in slices for d in s.spec.devices}
    assert held == {("fabric/cxl0.sw0", "gpu-0"), ("fabric/cxl0.sw0", "gpu-1"),
                    ("fabric/cxl0.sw1", "gpu-2"), ("fabric/cxl0.sw1", "nvme-0"),
                    ("fabric/cxl0.sw1", "cxl-0")}  # fmt: skip
    for s in slices:
        (term,) = s.spec.node_selector.node_selector_terms
        domain = s.spec.pool.name.split("/")[1]
        assert [(e.key, e.operator) for e in term.match_expressions] == [
            (LABEL_PREFIX + domain, "Exists")
        ]
        assert not term.match_fields and s.spec.node_name is None
    for d in fabric_pool(resource_api).values():
        assert d.binds_to_node and d.node_name is None and not d.consumes_counters
        assert d.binding_conditions == [READY_CONDITION]
        assert d.binding_failure_conditions == [FAILED_CONDITION]
        assert "resource.kubernetes.io/pcieRoot" not in d.attributes
    ns, node = namespace, env.nodes[1].name
    before = attach_requests(env)
    tmpl = template(resource_api, ns, "once", [gpu_request(fabric_device="gpu-0")])
    pod(core, ns, "once", node, tmpl)
    running(env, core, ns, "once", timeout=150)
    claim = claim_of(core, resource_api, ns, "once")
    (result,) = claim.status.allocation.devices.results
    assert result.pool == "fabric/cxl0.sw0"
    assert conditions(claim, result.device)[READY_CONDITION] == "True"
    (entry,) = [d for d in claim.status.devices if d.device == result.device]
    assert entry.pool == result.pool and entry.data["adapter"] == "adapter0"
    assert env.fabric.connections()["gpu-0"][:2] == (node, "adapter0")
    assert attach_requests(env) - before == Counter({("gpu-0", f"{node}/adapter0"): 1})
    gone(core, ns, "once")
    wait_for("gpu-0 detached", lambda: "gpu-0" not in env.fabric.connections(), timeout=60)


def test_a_device_only_one_node_reaches_goes_only_to_that_node(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    ns, first, second = namespace, env.nodes[0].name, env.nodes[1].name
    before = attach_requests(env)
    tmpl = template(resource_api, ns, "only", [gpu_request(fabric_device="gpu-2")])
    pod(core, ns, "pinned", second, tmpl)  # second's adapters reach no sw1 device
    said = refused(core, ns, "pinned")
    assert "cannot allocate all claims" in said or "resourceclaim" in said.lower(), said
    pod(core, ns, "free", None, tmpl)
    running(env, core, ns, "free", timeout=150)
    assert core.read_namespaced_pod("free", ns).spec.node_name == first
    assert env.fabric.connections()["gpu-2"][:2] == (first, "adapter1")
    assert attach_requests(env) - before == Counter({("gpu-2", f"{first}/adapter1"): 1})
    gone(core, ns, "free", "pinned")
    wait_for("gpu-2 detached", lambda: "gpu-2" not in env.fabric.connections(), timeout=60)


def one_runs(env: Env, core: Any, ns: str, pods: tuple[str, str]) -> str | None:
    """The one of ``pods`` that runs (None while neither does)."""
    env.check_alive()
    phases = {n: core.read_namespaced_pod(n, ns).status.phase for n in pods}
    return next((n for n, p in phases.items() if p == "Running"), None)


def explain(env: Env, core: Any, resource_api: Any, ns: str, pods: tuple[str, ...]) -> str:
    """Where the pods, their claims and the fabric stand (a failure's message)."""
    lines = [f"connections: {env.fabric.connections()}"]
    for name in pods:
        p = core.read_namespaced_pod(name, ns)
        said = [f"{c.type}={c.status} {c.message or ''}" for c in p.status.conditions or ()]
        lines.append(f"pod {name}: {p.status.phase} on {p.spec.node_name}: {said}")
        for st in p.status.resource_claim_statuses or ():
            c = resource_api.read_namespaced_resource_claim(st.resource_claim_name, ns)
            lines.append(f"  claim {st.resource_claim_name}: {c.status}")
    sched = Path(env.nodes[0].cluster.run_dir) / "logs" / "kube-scheduler.log"
    said = [
        ln for ln in sched.read_text(errors="replace").splitlines() if any(p in ln for p in pods)
    ]
    return "\n".join([*lines, *said[-30:], env.ctl.log_tail(40)])


def test_two_nodes_race_for_the_last_fabric_gpu_and_the_scheduler_decides(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """Two pods on two nodes ask for sw0's last free GPU, 20 rounds: each time
    one runs on it, attached to its node, the other stays pending with the
    scheduler's own reason, and no binding fails. A round after a loser that
    was allocated as its pod went passes only with the pool's renewal."""
    if env.dialect != DIALECTS[0]:  # the CI budget: rounds of 5 s (the scheduler's PreBind poll)
        pytest.skip("the race is the scheduler's, before any attach: one dialect tells it")
    ns, first, second = namespace, env.nodes[0].name, env.nodes[1].name
    # gpu-1 is held: gpu-0 is sw0's last free device, which both nodes reach.
    hold = template(resource_api, ns, "hold", [gpu_request(fabric_device="gpu-1")])
    pod(core, ns, "hold", first, hold)
    running(env, core, ns, "hold", timeout=150)
    race = template(resource_api, ns, "race", [on_switch("gpu", "sw0")])
    for i in range(20):
        a, b = f"a{i}", f"b{i}"
        pod(core, ns, a, first, race)
        pod(core, ns, b, second, race)

        runs = functools.partial(one_runs, env, core, ns, (a, b))
        try:
            winner = wait_for(f"one of {a}, {b} running", runs, timeout=150)
        except WaitTimedOut:
            pytest.fail(explain(env, core, resource_api, ns, (a, b, "hold")))
        loser = b if winner == a else a
        said = refused(core, ns, loser)
        assert "cannot allocate all claims" in said or "resourceclaim" in said.lower(), said
        claim = claim_of(core, resource_api, ns, winner)
        (result,) = claim.status.allocation.devices.results
        assert conditions(claim, result.device).get(FAILED_CONDITION) != "True"
        assert env.fabric.connections()["gpu-0"][0] == (first if winner == a else second)
        gone(core, ns, a, b)
        wait_for("gpu-0 detached", lambda: "gpu-0" not in env.fabric.connections(), timeout=60)
        # The next pair comes once the winner's claim is gone. The loser may have
        # been allocated gpu-0 as its pod went (gpu-0 freed between the two
        # deletes); the scheduler holds that in flight until its PreBind poll
        # finds the claim gone, refusing the next pair meanwhile, and only the
        # controller's renewal of the pool requeues them (driver/controller/requeue.py).
        wait_for(f"{winner}'s claim gone", functools.partial(
            claim_gone_or_free, resource_api, ns, claim.metadata.name), timeout=60)  # fmt: skip
    gone(core, ns, "hold")


def test_the_rdma_job_pairs_a_fabric_gpu_with_a_local_vf_through_the_nodes_adapter(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """rdma-job's claim (the example's own template): a fabric GPU, the node's
    fabric adapter and a VF, the adapter's root the VF's and its domain the
    GPU's. The first node has adapter0 (root 15, the VFs' root, sw0) and
    adapter1 (root 85, no VF there, sw1): the pair holds only through
    adapter0, which the controller attaches the GPU through. In the
    container, the GPU it sees is the one the node reports behind adapter0,
    and its VF's bus ID is under that adapter's root."""
    ns, sim = namespace, env.nodes[0]
    mine = [s for s in resource_api.list_resource_slice().items
            if s.spec.pool.name == f"fabric/adapters/{sim.name}"]  # fmt: skip
    adapters = {(s.spec.node_name, d.name, attr(d, "fabricDomain"), attr(d, ROOT))
                for s in mine for d in s.spec.devices}  # fmt: skip
    assert adapters == {
        (sim.name, adapter_device_name("adapter0"), "cxl0.sw0", "pci0000:15"),
        (sim.name, adapter_device_name("adapter1"), "cxl0.sw1", "pci0000:85"),
    }
    (tmpl,) = [d for d in yaml.safe_load_all(RDMA_JOB.read_text())
               if d and d["kind"] == "ResourceClaimTemplate"]  # fmt: skip
    resource_api.create_namespaced_resource_claim_template(ns, tmpl)
    before = attach_requests(env)
    pod(core, ns, "rdma", sim.name, tmpl["metadata"]["name"])
    running(env, core, ns, "rdma", timeout=150)
    claim = claim_of(core, resource_api, ns, "rdma")
    got = {r.request: (r.pool, r.device) for r in claim.status.allocation.devices.results}
    assert got["adapter"] == (f"fabric/adapters/{sim.name}", adapter_device_name("adapter0"))
    assert got["gpu"][0] == "fabric/cxl0.sw0"
    (gpu,) = [d for d, c in env.fabric.connections().items() if c[0] == sim.name]
    assert attach_requests(env) - before == Counter({(gpu, f"{sim.name}/adapter0"): 1})
    meta = core.read_node(sim.name).metadata
    seen = NodeFabric.from_node({"metadata": {"annotations": meta.annotations}})
    assert seen is not None
    given = dict(e.split("=", 1) for e in container_record(sim, ns, "rdma")["env"])
    assert seen.gpus[given["NVIDIA_VISIBLE_DEVICES"]] == "adapter0"
    (bdf,) = [
        v for k, v in given.items() if k.startswith("PATCHBAY_VF_") and k.endswith("_PCI_BUS_ID")
    ]
    assert pcie_root(sim.host.sysfs_root, bdf) == seen.adapters["adapter0"] == "pci0000:15"
    gone(core, ns, "rdma")
    wait_for(f"{gpu} detached", lambda: gpu not in env.fabric.connections(), timeout=60)


def test_gds_pairs_a_fabric_gpu_with_fabric_nvme_under_one_root(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """GDS (examples/gpu-nvme-gds.yaml): the GPU and the drive attached
    through the one adapter the claim got; in the container, the GPU's and
    the drive's PCI functions sit under that adapter's root."""
    ns = namespace
    sim, given = paired(env, resource_api, core, ns, "gpu-nvme-gds.yaml", "gds", "nvme-0")
    gpu = gpu_root(sim, given["NVIDIA_VISIBLE_DEVICES"])
    assert gpu == nvme_root(sim, given["PATCHBAY_NVME_DEVICES"]) == "pci0000:85"
    gone(core, ns, "gds")
    wait_for("all detached", lambda: not env.fabric.connections(), timeout=60)


def test_a_fabric_gpu_pairs_with_cxl_memory_behind_one_adapter(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """GPU + CXL memory (examples/gpu-cxl-memory.yaml): both attached through
    the claim's adapter; in the container, the node reports both behind it
    and the GPU and the memory device sit under its root."""
    ns = namespace
    sim, given = paired(env, resource_api, core, ns, "gpu-cxl-memory.yaml", "tier", "cxl-0")
    annotations = core.read_node(sim.name).metadata.annotations
    seen = NodeFabric.from_node({"metadata": {"annotations": annotations}})
    assert seen is not None
    serial = given["PATCHBAY_CXL_SERIAL_0"]
    memdevs = {a for k, a in seen.cxlmem.items() if cxl_serial_of(k) == cxl_identity(serial)}
    assert seen.gpus[given["NVIDIA_VISIBLE_DEVICES"]] == "adapter1" and memdevs == {"adapter1"}
    gpu = gpu_root(sim, given["NVIDIA_VISIBLE_DEVICES"])
    assert gpu == cxl_root(sim, serial) == seen.adapters["adapter1"] == "pci0000:85"
    gone(core, ns, "tier")
    wait_for("all detached", lambda: not env.fabric.connections(), timeout=60)


def test_a_full_adapter_fails_the_binding_naming_it_and_the_pod_lands_once_room_frees(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """adapter1 (the first node's, sw1) takes two devices. With the controller
    down, gpu-2 and nvme-0 are attached through it straight at the fabric
    (another tenant's, or left over), and a pod asks for sw1's CXL memory: the
    scheduler allocates it from the pool as stored. The controller comes back,
    finds adapter1 full and fails the binding naming the adapter and the node
    (no attach request for cxl-0, FabricAdapterFull); it detaches the two
    devices nothing needs, the room frees, and the pod lands with cxl-0
    attached through adapter1."""
    if env.dialect != DIALECTS[0]:  # the CI budget: the refusal is the controller's, no attach
        pytest.skip("the refusal asks nothing of the fabric: one dialect tells it")
    ns, sim = namespace, env.nodes[0]
    env.ctl.kill()
    try:
        for device in ("gpu-2", "nvme-0"):
            env.fabric.request("POST", "/redfish/v1/Fabrics/cxl0/Connections", {"Links": {
                "InitiatorEndpoints": [{"@odata.id": f"/redfish/v1/Fabrics/cxl0/Endpoints/"
                                                     f"{sim.name}-adapter1"}],
                "TargetEndpoints": [{"@odata.id": f"/redfish/v1/Fabrics/cxl0/Endpoints/{device}"}],
            }})  # fmt: skip
        wait_for("adapter1 full", lambda: {"gpu-2", "nvme-0"} <= set(env.fabric.connections()))
        before = attach_requests(env)
        memory = {"name": "memory", "exactly": {"deviceClassName": "cxl-memory.patchbay.dev"}}
        pod(core, ns, "full", None, template(resource_api, ns, "full", [memory]))

        def allocated() -> str:
            p = core.read_namespaced_pod("full", ns)
            (st,) = p.status.resource_claim_statuses or [None]
            name = st.resource_claim_name if st else ""
            claim = resource_api.read_namespaced_resource_claim(name, ns) if name else None
            return name if claim and claim.status and claim.status.allocation else ""

        claim = wait_for("the claim allocated", allocated, timeout=60)
    finally:
        env.ctl.start(identity="controller-room")
    (event, *_) = wait_for(
        "FabricAdapterFull on the claim",
        lambda: env.check_alive() and events_about(core, ns, claim, "FabricAdapterFull"),
        timeout=60,
    )
    assert "adapter1" in event.message and sim.name in event.message, event.message
    running(env, core, ns, "full", timeout=150)
    assert env.fabric.connections()["cxl-0"][:2] == (sim.name, "adapter1")
    assert attach_requests(env) - before == Counter({("cxl-0", f"{sim.name}/adapter1"): 1})
    assert not {"gpu-2", "nvme-0"} & set(env.fabric.connections())  # detached: nothing needs them
    gone(core, ns, "full")
    wait_for("all detached", lambda: not env.fabric.connections(), timeout=60)


def held(resource_api: Any) -> list[tuple[str, str]]:
    """(pool, fabric device) of every published fabric device, sorted."""
    slices = fabric_slices(resource_api)
    return sorted((s.spec.pool.name, attr(d, "fabricDevice")) for s in slices
                  for d in s.spec.devices or ())  # fmt: skip


# Local GPUs have no such attribute: the expression a class that prefers spares uses.
SPARE_CEL = (
    '"spare" in device.attributes["patchbay.dev"] && device.attributes["patchbay.dev"].spare'
)


def test_a_spare_first_claim_takes_the_spare_on_its_node_with_no_attach(
    env: Env, resource_api: Any, core: Any, namespace: str
) -> None:
    """A fixed spare is published once, in its node's own pool (offered on
    that node only, no binding conditions) and in no domain pool; a claim
    whose prioritized list puts spares first gets it on that node, Ready at
    once, with no attach request for it."""
    if env.dialect != DIALECTS[0]:  # the CI budget: the spare's attach is any attach's
        pytest.skip("publication and allocation are the scheduler's: one dialect tells it")
    ns, plain = namespace, env.ctl.extra
    env.ctl.extra = (*plain, "--spares-fixed=gpu:H100-SXM5-80GB=1", "--spares-cap=0.5")
    restart(env, "controller-spares")
    try:

        def spare_slices() -> list[Any]:
            found = fabric_slices(resource_api)
            return [s for s in found if s.spec.pool.name.startswith("fabric/spares/")
                    and s.spec.devices]  # fmt: skip

        (spares, *_) = wait_for("a spare in its node's pool", spare_slices, timeout=90)
        pool = spares.spec.pool.name
        node = pool.split("/", 2)[2]
        (dev, *_) = spares.spec.devices
        device = attr(dev, "fabricDevice")
        assert spares.spec.node_name == node and dev.attributes["spare"].bool
        assert not dev.binding_conditions and env.fabric.connections()[device][0] == node
        assert all(p == pool for p, d in held(resource_api) if d == device)  # published once
        before = attach_requests(env)
        request = {"name": "gpu", "firstAvailable": [
            {"name": "spare", "deviceClassName": "gpu.patchbay.dev",
             "selectors": [{"cel": {"expression": SPARE_CEL}}]},
            {"name": "fabric", "deviceClassName": "gpu.patchbay.dev"},
        ]}  # fmt: skip
        pod(core, ns, "first", node, template(resource_api, ns, "spare-first", [request]))
        running(env, core, ns, "first", timeout=60)
        claim = claim_of(core, resource_api, ns, "first")
        (result,) = claim.status.allocation.devices.results
        assert (result.request, result.pool) == ("gpu/spare", pool), result
        assert not result.binding_conditions and attr(dev, "fabricDevice") == device
        assert result.device == dev.name
        assert [t for t, _ in attach_requests(env) - before if t == device] == []  # no attach
        gone(core, ns, "first")
    finally:
        env.ctl.extra = plain
        restart(env, "controller-domain")
    wait_for("every spare detached", lambda: not env.fabric.connections(), timeout=90)
