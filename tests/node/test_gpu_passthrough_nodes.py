"""A whole GPU handed to a VM (``vfio-gpu.patchbay.dev``) in a real container.

While the claim is prepared the simulated host's GPU is bound to
``vfio-pci`` (its sysfs ``driver`` link, which the plugin changed through
the rebind sequence), the container sees ``/dev/vfio/vfio`` and
``/dev/vfio/<group>`` for the GPU's IOMMU group (the CDI spec's device
nodes, made by runc) and the env naming both; once the pod is gone the
kubelet has unprepared the claim, the GPU is back on its native driver and
published again.
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric.simhost.host import SimHost
from tests.e2e.helpers import wait_for
from tests.node.helpers import Tier, attr, on_node, seen

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

BUS = "resource.kubernetes.io/pciBusID"
DONE = "printed"
# Prints the PATCHBAY_ env and every node under /dev/vfio, then waits.
PRINT = (
    "env | grep -E '^PATCHBAY_' | sort; ls /dev/vfio | sed 's|^|/dev/vfio/|'; "
    f"echo {DONE}; trap 'exit 0' TERM; while :; do sleep 1; done"
)


def vm_docs() -> list[dict[str, Any]]:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm-gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "vfio-gpu.patchbay.dev"}}]}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vm-job"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main", "image": "busybox:1.35", "command": ["sh", "-c", PRINT],
                "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "vm-gpu"}],
        },
    }  # fmt: skip
    return on_node([claim, pod], "node-a")


def test_vfio_gpu_pod_sees_its_group_and_the_driver_comes_back(tier: Tier, namespace: str) -> None:
    ns = namespace
    host = SimHost.open(tier.nodes["node-a"].real.sim_dir)
    published = tier.devices_by_name()  # before: a GPU in passthrough is withdrawn
    tier.apply(ns, vm_docs())
    tier.running(ns, "vm-job")
    claim = tier.get("resourceclaim", "vm-gpu", "-n", ns)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    key = (result["pool"], result["device"])
    bdf = attr(published[key], BUS)
    native = host.native_driver(bdf)
    assert native == "nvidia", native
    assert host.tree.driver_of(bdf) == "vfio-pci"
    group = (host.tree.path_of(bdf) / "iommu_group").resolve().name
    lines = wait_for("vm-job printed what it sees", lambda: (
        (out := tier.logs(ns, "vm-job")) and out[-1] == DONE and out), timeout=30)  # fmt: skip
    env, nodes = seen(lines)
    assert {"/dev/vfio/vfio", f"/dev/vfio/{group}"} <= nodes, nodes
    prefix = "PATCHBAY_" + result["device"].upper().replace("-", "_")
    assert env[f"{prefix}_VFIO_GROUP"] == group, env
    assert env[f"{prefix}_PCI_BUS_ID"] == bdf, env
    # Not offered for other uses meanwhile (NVML no longer lists it; the rescan withdraws it).
    wait_for(f"{result['device']} withdrawn", lambda: key not in tier.devices_by_name(),
             timeout=60)  # fmt: skip

    tier.delete_pod(ns, "vm-job")
    wait_for(f"{bdf} back on {native}", lambda: host.tree.driver_of(bdf) == native, timeout=60)
    wait_for(f"{result['device']} published again", lambda: key in tier.devices_by_name(),
             timeout=60)  # fmt: skip
