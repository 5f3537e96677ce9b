"""Shared claims and GpuConfig.sharing on the real control plane.

One simulated node of 2 x H100 (the plugin pointed at the host's
``nvidia-smi`` and ``nvidia-cuda-mps-control`` stand-ins); the node agent is
the kubelet's own DRA manager, so it prepares a claim once per node however
many pods reference it and unprepares it when the last one goes.

- An MPS ResourceClaim shared by two pods (the claim of the shipped
  deviceclasses/examples/mps-pair.yaml): prepared once (one prepare in the
  plugin's log, one daemon start), compute mode EXCLUSIVE_PROCESS in the C
  mock, both pods' containers get the pipe directory and the limits; the
  daemon survives ``kill -9`` of the plugin (the restarted plugin adopts it);
  the first pod's deletion leaves it, the second's stops it and resets the
  compute mode.
- Two containers of one pod on one TimeSlicing GPU (the template of
  two-containers-one-gpu.yaml): both see the same GPU; the interval is Long
  while the pod runs and Default after.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from driver.gpu.sharing.mps import MpsDaemons, start_time
from fabric.simhost.nvidia_smi import read_record
from tests.e2e.helpers import delete_quietly, unique, wait_for
from tests.e2e.plugin_nodes import plugin_node
from tests.e2e.pods import gone, pod, running
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

pytestmark = pytest.mark.cluster

EXCLUSIVE_PROCESS = 3
EXAMPLES = Path(__file__).resolve().parents[2] / "deviceclasses" / "examples"


def example_spec(file: str, kind: str) -> dict[str, Any]:
    """The claim spec of the shipped example (a template's inner spec)."""
    doc = next(d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d["kind"] == kind)
    spec: dict[str, Any] = doc["spec"]
    return spec["spec"] if kind == "ResourceClaimTemplate" else spec


@pytest.fixture(scope="module")
def sim(
    local_cluster: LocalCluster, resource_api: client.ResourceV1Api, core: client.CoreV1Api
) -> Iterator[SimNode]:
    def stop_mps(node: SimNode) -> None:
        for d in node.host.mps_root.glob("*"):
            MpsDaemons(node.host.mps_control, node.host.mps_root).stop(d)
        shutil.rmtree(node.host.mps_root, ignore_errors=True)

    with plugin_node(
        local_cluster, resource_api, core, "share", "2-gpus",
        ready=lambda n: n >= 2, what="GPUs published", after_stop=stop_mps,
    ) as node:  # fmt: skip
        yield node


def envs(sim: SimNode, ns: str, name: str) -> list[list[str]]:
    record = sim.agent.pod_record(ns, name)
    assert record is not None
    containers = record["containers"]
    assert isinstance(containers, dict)
    return [list(c["env"]) for c in containers.values()]


def plugin_log(sim: SimNode) -> str:
    return Path(sim.plugin.log_path).read_text()


def prepares(sim: SimNode, uid: str) -> int:
    """The plugin's prepares of the claim (its debug line per prepare done)."""
    lines = plugin_log(sim).splitlines()
    return sum(
        1
        for line in lines
        if "prepared " in line and f"({uid})" in line and "unprepare" not in line
    )


def modes(sim: SimNode) -> list[int]:
    gpus = sorted(sim.host.nvml.read()["gpus"], key=lambda g: g["pci_bus_id"])
    return [int(g.get("compute_mode", 0)) for g in gpus]


def test_an_mps_claim_shared_by_two_pods_is_prepared_once_and_outlives_a_plugin_crash(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, name = namespace, unique("mps")
    spec = example_spec("mps-pair.yaml", "ResourceClaim")  # the shipped MPS pair's claim
    claim = resource_api.create_namespaced_resource_claim(
        ns, {"metadata": {"name": name}, "spec": spec}
    )
    uid = claim.metadata.uid
    daemons = MpsDaemons(sim.host.mps_control, sim.host.mps_root)
    directory = daemons.directory(uid)
    pod(core, ns, "a", sim.name, {"resourceClaimName": name})
    running(core, ns, "a")
    pid = daemons.running(directory)
    assert pid is not None and EXCLUSIVE_PROCESS in modes(sim)
    pod(core, ns, "b", sim.name, {"resourceClaimName": name})
    running(core, ns, "b")
    reserved = resource_api.read_namespaced_resource_claim(name, ns).status.reserved_for
    assert sorted(r.name for r in reserved) == ["a", "b"]
    for p in ("a", "b"):
        (env,) = envs(sim, ns, p)
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env
    assert prepares(sim, uid) == 1  # the second pod found the claim prepared
    logs = daemons.dirs(directory)[1]
    assert (logs / "control.log").read_text().count("Startup") == 1
    told = json.loads((logs / "standin-state.json").read_text())
    assert told["active_thread_percentage"] == 50
    # A plugin crash and restart: the running pods' daemon stays, adopted.
    registered = plugin_log(sim).count("registered with the kubelet")
    sim.plugin.kill()
    sim.plugin.start()
    wait_for(
        "plugin registered again",
        lambda: plugin_log(sim).count("registered with the kubelet") > registered,
        timeout=60,
    )
    assert daemons.running(directory) == pid
    gone(core, ns, "a")
    assert daemons.running(directory) == pid and EXCLUSIVE_PROCESS in modes(sim)
    gone(core, ns, "b")  # the last user: unprepared
    wait_for("daemon stopped", lambda: start_time(pid) is None, timeout=30)
    assert not directory.exists() and modes(sim) == [0, 0]
    assert (logs / "control.log").exists() is False
    delete_quietly(resource_api.delete_namespaced_resource_claim, name, ns)


def test_two_containers_of_one_pod_share_a_time_sliced_gpu(
    sim: SimNode, resource_api: client.ResourceV1Api, core: client.CoreV1Api, namespace: str
) -> None:
    ns, tmpl = namespace, unique("ts")
    spec = example_spec("two-containers-one-gpu.yaml", "ResourceClaimTemplate")
    resource_api.create_namespaced_resource_claim_template(
        ns, {"metadata": {"name": tmpl}, "spec": {"spec": spec}}
    )
    pod(core, ns, "two", sim.name, tmpl, containers=2)
    running(core, ns, "two")
    first, second = envs(sim, ns, "two")
    visible = [e for e in first if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert len(visible) == 1 and visible[0] in second
    uuid = visible[0].split("=", 1)[1]
    assert read_record(sim.host.dir)["timeslice"] == {uuid: 3}
    gone(core, ns, "two")
    wait_for("interval reset", lambda: read_record(sim.host.dir)["timeslice"] == {uuid: 0})
