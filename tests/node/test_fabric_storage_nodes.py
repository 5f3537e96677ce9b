"""NVMe drives and CXL memory from the fabric, in real containers on real nodes.

The examples ``gpu-nvme-gds.yaml`` (a fabric GPU and an NVMe drive) and
``gpu-cxl-memory.yaml`` (a fabric GPU and CXL Type 3 memory), each through
one fabric adapter of the node in one reach domain (the chart's default
shape, per-domain; node-c carries its reach labels as provisioning would),
run unpinned: the scheduler can satisfy them only with the
simulated CXL fabric's devices behind node-c's adapter0
(``tests.harness.realnode_chart.fabric_values``), so the controller attaches them, the
fabric hot-adds them on node-c's simulated host, the plugin prepares them and
containerd hands the container the nodes its CDI spec names. What each test
reads is what a user sees: the container's own output, the claim, the
``kubectl patchbay fabric`` view and the controller's Events; on the node,
the CDI directory and the simulated host's sysfs (what the kernel would
show).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from driver.fabric_devices.naming import identity
from tests.e2e.helpers import wait_for
from tests.node.helpers import Tier, attr, example, seen

# The first test of the session also waits for it: image build, nodes, helm install.
pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

GIB = 1 << 30
PODS = {"gds-job": "drive", "cxl-tier-job": "memory"}  # pod -> its fabric request
DOMAIN = "patchbay.dev/fabricDomain"


def fabric_view(tier: Tier) -> dict[str, dict[str, Any]]:
    """``kubectl patchbay fabric -o json``'s devices by fabric device id."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl-patchbay"), "fabric", "-o", "json",
         f"--kubeconfig={tier.cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    return {d["device"]: d for d in json.loads(out)["devices"]}


def requests_of(tier: Tier, ns: str, pod: str) -> dict[str, dict[str, Any]]:
    """The pod's claim: each request's published device."""
    claim = tier.claim_of(ns, pod)
    devices = tier.devices_by_name()
    results = claim["status"]["allocation"]["devices"]["results"]
    return {r["request"]: devices[(r["pool"], r["device"])] for r in results}


def test_fabric_nvme_and_cxl_memory_reach_containers_and_return(tier: Tier, namespace: str) -> None:
    ns, node = namespace, tier.nodes["node-c"]
    started = time.monotonic()
    tier.apply(ns, example("gpu-nvme-gds.yaml") + example("gpu-cxl-memory.yaml"))
    got: dict[str, dict[str, dict[str, Any]]] = {}
    for pod, request in PODS.items():
        assert tier.running(ns, pod, timeout=240)["spec"]["nodeName"] == node.name
        tier.record(f"{pod}: apply to Running (fabric GPU + {request}, attached)",
                    f"{time.monotonic() - started:.2f}s")  # fmt: skip
        got[pod] = requests_of(tier, ns, pod)
        adapter = got[pod].pop("adapter")  # the node's adapter, through which both attach
        assert attr(adapter, "patchbay.dev/fabricAdapter") == "adapter0", adapter
        assert {attr(d, "patchbay.dev/attachment") for d in got[pod].values()} == {"fabric"}
        assert {attr(d, DOMAIN) for d in got[pod].values()} == {attr(adapter, DOMAIN)}
        claim = tier.claim_of(ns, pod)
        conds = {c["type"]: c["status"] for d in claim["status"]["devices"]
                 for c in d["conditions"]}  # fmt: skip
        assert conds.get("FabricDeviceReady") == "True", claim["status"]

    # GPUDirect Storage: the drive's namespace (block) and its generic char device.
    gpu, drive = got["gds-job"]["gpu"], got["gds-job"]["drive"]
    assert attr(drive, "patchbay.dev/type") == "nvme"
    env, nodes = seen(tier.logs(ns, "gds-job"))
    blocks = env["PATCHBAY_NVME_DEVICES"].split(",")
    generics = env["PATCHBAY_NVME_GENERIC_DEVICES"].split(",")
    assert blocks and all(p.startswith("/dev/nvme") for p in blocks), env
    assert generics and all(p.startswith("/dev/ng") for p in generics), env
    assert set(blocks) | set(generics) <= nodes, (env, nodes)
    assert identity("nvme", env["PATCHBAY_NVME_SERIAL_0"]) == identity(
        "nvme", attr(drive, "serial")
    )
    assert env["NVIDIA_VISIBLE_DEVICES"] == attr(gpu, "patchbay.dev/uuid")

    # CXL memory in devdax mode: /dev/daxR.0 with the size and NUMA node the host shows.
    memory = got["cxl-tier-job"]["memory"]
    assert attr(memory, "patchbay.dev/type") == "cxlmem"
    env, nodes = seen(tier.logs(ns, "cxl-tier-job"))
    (dax,) = env["PATCHBAY_CXL_DEVICES"].split(",")
    assert dax in nodes and dax.startswith("/dev/dax"), (env, nodes)
    sysfs = node.real.sim_dir / "sys" / "bus" / "dax" / "devices" / dax.removeprefix("/dev/")
    assert int(env["PATCHBAY_CXL_SIZE_0"]) == int((sysfs / "size").read_text()) == 256 * GIB
    assert env["PATCHBAY_CXL_NUMA_NODE_0"] == (sysfs / "target_node").read_text().strip()
    assert identity("cxlmem", env["PATCHBAY_CXL_SERIAL_0"]) == identity(
        "cxlmem", attr(memory, "serial")
    )

    view = fabric_view(tier)
    for device in ("nvme-0", "cxl-0"):
        assert view[device]["state"] == "held", view[device]
        assert view[device]["attached"] == {"node": node.name, "adapter": "adapter0",
                                            "busy": True}, view[device]  # fmt: skip

    uids = [tier.claim_of(ns, pod)["metadata"]["uid"] for pod in PODS]
    claims = [tier.claim_of(ns, pod)["metadata"]["name"] for pod in PODS]
    for pod in PODS:
        tier.delete_pod(ns, pod)
    # Unprepared (CDI specs gone), detached by the controller, free in the pool again.
    wait_for("CDI specs removed", lambda: not any(
        u in name for u in uids for name in node.claim_specs()), timeout=60)  # fmt: skip

    wanted = {f"fabric device {d} detached from node {node.name}" for d in ("nvme-0", "cxl-0")}

    def returned() -> bool:
        view = fabric_view(tier)
        if any(view[d]["state"] != "free" or view[d]["attached"] for d in ("nvme-0", "cxl-0")):
            return False
        return wanted <= {e["message"] for c in claims for e in tier.events(ns, c)
                          if e["reason"] == "Detached"}  # fmt: skip

    wait_for("NVMe drive and CXL memory detached (Events), free in the pool", returned, 120)
    assert not list((node.real.sim_dir / "sys" / "bus" / "dax" / "devices").glob("dax*"))
