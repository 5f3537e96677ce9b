"""patchbay on kind: the examples as real containers in kind nodes.

What a user of hack/kind/up.sh sees: a GPU pod printing its GPU's UUID, a MIG
pod printing its MIG UUID, a GPU and a VF on one PCIe root; deleting the pods
removes their CDI specs in the node. The last test runs hack/kind/down.sh and
checks the host: nothing left (containers, links, chains, mounts, sysctls, the
private dockerd) and no packet from the kind network to anywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import wait_for
from tests.kind.conftest import REPO, RUN, KindTier
from tests.kind.hoststate import GUARD, HostState, guard_count
from tests.node.helpers import attr, seen

pytestmark = [pytest.mark.kind, pytest.mark.timeout(2400)]

UUID = "patchbay.dev/uuid"
ROOT = "resource.kubernetes.io/pcieRoot"
BUS = "resource.kubernetes.io/pciBusID"
CDI_DIR = "/var/run/cdi"  # the chart's kubeletPlugin.cdiRoot, inside each node
PODS = ("gpu-job", "mig-1g-job", "rdma-job")


def _read(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def _get(tier: KindTier, *args: str) -> Any:
    return json.loads(tier.kubectl("get", *args, "-o", "json"))


def _running(tier: KindTier, pod: str) -> dict[str, Any]:
    tier.kubectl("wait", "--for=jsonpath={.status.phase}=Running", f"pod/{pod}", "--timeout=300s")
    pod_doc: dict[str, Any] = _get(tier, "pod", pod)
    return pod_doc


def _claim(tier: KindTier, pod: str) -> dict[str, Any]:
    (status,) = _get(tier, "pod", pod)["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = _get(tier, "resourceclaim", status["resourceClaimName"])
    return claim


def _allocated(tier: KindTier, pod: str) -> dict[str, dict[str, Any]]:
    """request -> published device of the pod's claim."""
    devices = {
        (s["spec"]["pool"]["name"], d["name"]): d
        for s in _get(tier, "resourceslices")["items"]
        for d in s["spec"].get("devices", [])
    }
    results = _claim(tier, pod)["status"]["allocation"]["devices"]["results"]
    return {r["request"]: devices[(r["pool"], r["device"])] for r in results}


def _printed(tier: KindTier, pod: str) -> dict[str, str]:
    env, _ = seen(tier.kubectl("logs", pod).splitlines())
    return env


def _cdi_specs(tier: KindTier, node: str) -> list[str]:
    return tier.run("docker", "exec", node, "ls", CDI_DIR).split()


def test_gpu_pod_shows_its_uuid(kind_tier: KindTier) -> None:
    _running(kind_tier, "gpu-job")
    (gpu,) = _allocated(kind_tier, "gpu-job").values()
    uuid = attr(gpu, UUID)
    assert uuid.startswith("GPU-"), gpu
    assert _printed(kind_tier, "gpu-job")["NVIDIA_VISIBLE_DEVICES"] == uuid


def test_mig_pod_shows_its_mig_uuid(kind_tier: KindTier) -> None:
    pod = _running(kind_tier, "mig-1g-job")
    mig = _printed(kind_tier, "mig-1g-job")["NVIDIA_VISIBLE_DEVICES"]
    assert mig.startswith("MIG-"), mig
    (device,) = _allocated(kind_tier, "mig-1g-job").values()
    assert attr(device, "patchbay.dev/type") == "mig"
    # The instance exists in that node's NVML (mock) state, on this side of the mount.
    state = RUN / "sim" / pod["spec"]["nodeName"] / "nvml-state.json"
    assert mig in state.read_text()


def test_gpu_and_vf_pair_on_one_pcie_root(kind_tier: KindTier) -> None:
    _running(kind_tier, "rdma-job")
    got = _allocated(kind_tier, "rdma-job")
    gpu, vf = got["gpu"], got["nic"]
    assert attr(gpu, ROOT) == attr(vf, ROOT)
    env = _printed(kind_tier, "rdma-job")
    assert env["NVIDIA_VISIBLE_DEVICES"] == attr(gpu, UUID)
    assert attr(vf, BUS) in {v for k, v in env.items() if k.endswith("_PCI_BUS_ID")}, env


def test_deleting_pods_removes_their_cdi_specs(kind_tier: KindTier) -> None:
    where = {}
    for pod in PODS:
        node = _running(kind_tier, pod)["spec"]["nodeName"]
        uid = _claim(kind_tier, pod)["metadata"]["uid"]
        assert any(uid in name for name in _cdi_specs(kind_tier, node)), (pod, node)
        where[uid] = node
    kind_tier.kubectl("delete", "pod", *PODS, "--wait=true", "--timeout=120s")
    for uid, node in where.items():
        wait_for(
            f"CDI spec of claim {uid} removed on {node}",
            lambda: not any(uid in n for n in _cdi_specs(kind_tier, node)),  # noqa: B023
            timeout=60,
        )


def test_down_leaves_nothing_and_nothing_left_the_network(kind_tier: KindTier) -> None:
    kind_tier.down()
    after = HostState.read()
    before = kind_tier.before
    assert dict(after.sysctls) == dict(before.sysctls)
    assert after.forward_policy == before.forward_policy
    assert after.chains - before.chains - {f"mangle/{GUARD}"} == set(), "iptables chains left"
    assert after.links - before.links == set(), "network links left"
    assert after.mounts - before.mounts == set(), "mounts left"
    assert after.lib_modules == before.lib_modules
    # The simulated hosts' effect processes that up.sh started are gone.
    effects = [
        p for p in Path("/proc").glob("[0-9]*/cmdline")
        if str(RUN / "sim") in _read(p) and "effects" in _read(p)
    ]  # fmt: skip
    assert effects == [], effects
    # No container left in the private daemon's data root (kind deleted its nodes).
    data_root = kind_tier.run(str(REPO / "hack/kind/dockerd.sh"), "data-root").strip()
    containers = Path(data_root, "containers")
    assert not containers.exists() or list(containers.iterdir()) == []
    run_dir = Path("/run/patchbay-docker")
    assert not (run_dir / "docker.sock").exists(), "the private dockerd still runs"
    assert not (run_dir / "dockerd.pid").exists()
    # No packet from the kind nodes reached any address but the bridge's own.
    assert guard_count() == 0
