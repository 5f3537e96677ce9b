"""GPU sharing on real nodes: what the containers see, and MPS daemons that
survive a rolling update of the plugin.

Why this module exists: the cluster tiers check the CDI specs the plugin
writes; here real containers (runc through containerd's CDI support) show
what they got, through ``kubectl logs``. The session's values
(tests/node/conftest.py) make node-a's GPU 3 a fractional GPU and turn on the
MPS supervisor; the node's driver root holds the simulated host's stand-ins
of ``nvidia-smi`` and ``nvidia-cuda-mps-control`` (tests/harness/realnode_node.py).
The MPS daemon is found from the host, in its ``/proc``: a process of the
supervisor pod's container whose pipe directory is the claim's.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from driver.gpu.sharing.mps import start_time
from tests.e2e.helpers import wait_for
from tests.node.helpers import RELEASE_NS, UUID, Tier, allocated, attr, example, on_node, seen

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

MPS_ROOT = "/run/patchbay/mps"  # the chart's default kubeletPlugin.mpsRoot
EXCLUSIVE_PROCESS = 3
SUPERVISOR_LABELS = "app.kubernetes.io/component=mps-supervisor"
MPS_PODS = ("mps-client-a", "mps-client-b")
# What an MPS client prints: its CUDA_MPS_* variables, the pipe and log
# mounts (path and options) and what is in the pipe directory.
MPS_SHOW = (
    "env | grep ^CUDA_MPS_; grep nvidia-mps /proc/mounts | cut -d' ' -f2,4; "
    "ls /tmp/nvidia-mps; trap 'exit 0' TERM; while :; do sleep 1; done"
)


def container_logs(tier: Tier, ns: str, pod: str, container: str) -> list[str]:
    return tier.kubectl("logs", pod, "-n", ns, "-c", container).splitlines()


def test_two_containers_of_one_pod_see_the_same_gpu(tier: Tier, namespace: str) -> None:
    node = tier.nodes["node-a"]
    tier.apply(namespace, on_node(example("two-containers-one-gpu.yaml"), node.name))
    tier.running(namespace, "finetune-and-serve")
    ((_, device),) = allocated(tier, namespace, "finetune-and-serve")
    gpu = attr(device, UUID)
    for container in ("finetune", "serve"):
        env, _ = seen(container_logs(tier, namespace, "finetune-and-serve", container))
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpu, (container, env)
    # TimeSlicing Long, through the nvidia-smi stand-in at the node's driver root.
    record = node.real.sim_dir / "nvidia-smi.json"
    assert json.loads(record.read_text())["timeslice"][gpu] == 3
    tier.delete_pod(namespace, "finetune-and-serve")
    wait_for("time-slice reset", lambda: json.loads(
        record.read_text())["timeslice"][gpu] == 0, timeout=60)  # fmt: skip


def test_a_fractional_claim_sees_its_hami_core_limits(tier: Tier, namespace: str) -> None:
    template, deployment = example("four-inference-replicas.yaml")
    spec = deployment["spec"]["template"]["spec"]
    spec.update(restartPolicy="Never", nodeSelector={"kubernetes.io/hostname": "node-a"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "share"}, "spec": spec}
    tier.apply(namespace, [template, pod])
    tier.running(namespace, "share")
    ((_, device),) = allocated(tier, namespace, "share")
    assert attr(device, "patchbay.dev/type") == "shared-gpu"
    (result,) = tier.claim_of(namespace, "share")["status"]["allocation"]["devices"]["results"]
    assert result["shareID"] and result["consumedCapacity"] == {"memory": "20Gi", "cores": "25"}
    env, _ = seen(tier.logs(namespace, "share"))
    assert env["NVIDIA_VISIBLE_DEVICES"] == attr(device, UUID), env
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20480m", env
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == "25", env
    tier.delete_pod(namespace, "share")


def host_daemons(claim_uid: str) -> list[tuple[int, int]]:
    """(host pid, start time) of each live MPS control daemon of the claim."""
    pipe = f"CUDA_MPS_PIPE_DIRECTORY={MPS_ROOT}/{claim_uid}/pipe".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            daemon = b"-d" in (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        started = start_time(int(proc.name))
        if pipe in env and daemon and started is not None:
            found.append((int(proc.name), started))
    return found


def compute_mode(state: Path, gpu: str) -> int:
    """The GPU's compute mode in the node's NVML (mock) state."""
    (mode,) = [g.get("compute_mode", 0) for g in json.loads(state.read_text())["gpus"]
               if g["uuid"] == gpu]  # fmt: skip
    return int(mode)


def supervisor_on(tier: Tier, node: str) -> dict[str, Any]:
    pods = tier.get("pods", "-n", RELEASE_NS, "-l", SUPERVISOR_LABELS)["items"]
    (pod,) = [p for p in pods if p["spec"].get("nodeName") == node]
    return dict(pod)


def mps_pair(node: str) -> list[dict[str, Any]]:
    docs = on_node(example("mps-pair.yaml"), node)
    for d in docs[1:]:
        d["spec"]["containers"][0]["command"] = ["sh", "-c", MPS_SHOW]
    return docs


def test_mps_daemon_lives_in_the_supervisor_pod_through_a_plugin_rolling_update(
    tier: Tier, namespace: str
) -> None:
    node = tier.nodes["node-a"]
    tier.apply(namespace, mps_pair(node.name))
    for pod in MPS_PODS:
        tier.running(namespace, pod)
    claim = tier.get("resourceclaim", "mps-gpu", "-n", namespace)
    uid = claim["metadata"]["uid"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    gpu = attr(tier.devices_by_name()[(result["pool"], result["device"])], UUID)
    state = node.real.sim_dir / "nvml-state.json"
    for pod in MPS_PODS:
        lines = tier.logs(namespace, pod)
        env, _ = seen(lines)
        assert env == {
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            "CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        }, lines
        mounts = dict(line.split(" ", 1) for line in lines if line.startswith("/"))
        assert mounts["/tmp/nvidia-mps"].startswith("rw"), lines
        assert mounts["/var/log/nvidia-mps"].startswith("ro"), lines
        assert {"control", "nvidia-cuda-mps-control.pid"} <= set(lines), lines  # the daemon's
    ((daemon_pid, daemon_start),) = host_daemons(uid)  # one daemon for the two pods
    supervisor = supervisor_on(tier, node.name)
    cid = supervisor["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    assert cid in Path(f"/proc/{daemon_pid}/cgroup").read_text()  # runs in the supervisor pod
    directory = node.real.host_path(f"{MPS_ROOT}/{uid}")
    assert json.loads((directory / "daemon.json").read_text())["start_time"] == daemon_start
    assert compute_mode(state, gpu) == EXCLUSIVE_PROCESS
    clients = {p: tier.pod(namespace, p)["status"]["containerStatuses"][0] for p in MPS_PODS}

    old = tier.plugin_pod_on(node.name)["metadata"]["uid"]
    started = time.monotonic()
    # logLevel: the supervisor's pod template changes too (OnDelete keeps its pod).
    # "r-": helm's --set reads an all-digit hex string (about 1 run in 50) as a
    # number, and the chart's schema refuses a number as an annotation.
    tier.release.upgrade("kubeletPlugin.logLevel=debug",
                         f"kubeletPlugin.podAnnotations.roll=r-{uuid.uuid4().hex[:8]}")  # fmt: skip

    def rolled() -> bool:
        pods = [p for p in tier.plugin_pods() if p["spec"].get("nodeName") == node.name]
        return (
            len(pods) == 1
            and pods[0]["metadata"]["uid"] != old
            and all(c.get("ready") for c in pods[0]["status"].get("containerStatuses", []))
        )

    wait_for("node-a's plugin pod replaced", rolled, timeout=180)
    tier.record("MPS claim: helm upgrade to node-a's plugin pod replaced",
                f"{time.monotonic() - started:.1f}s")  # fmt: skip

    def answered() -> bool:  # the new plugin's start-up wanted the daemon again
        want = json.loads((directory / "want.json").read_text())
        return bool(
            json.loads((directory / "ready.json").read_text())["request"] == want["request"]
        )

    wait_for("the supervisor answered the new plugin", answered, timeout=60)
    assert host_daemons(uid) == [(daemon_pid, daemon_start)]  # the same process
    now = supervisor_on(tier, node.name)
    assert now["metadata"]["uid"] == supervisor["metadata"]["uid"]
    assert now["status"]["containerStatuses"][0]["restartCount"] == 0
    for pod, before in clients.items():
        after = tier.pod(namespace, pod)
        assert after["status"]["phase"] == "Running"
        status = after["status"]["containerStatuses"][0]
        assert (status["containerID"], status["restartCount"]) == (before["containerID"], 0)

    for pod in MPS_PODS:
        tier.delete_pod(namespace, pod)
    wait_for("the daemon and its directory gone", lambda: not host_daemons(uid)
             and not directory.exists(), timeout=90)  # fmt: skip
    assert compute_mode(state, gpu) == 0  # DEFAULT again
