"""Render the README's ``kubectl patchbay`` samples from a real e2e-tier run.

Why: the README shows ``kubectl patchbay nodes`` and the SVG of the demo's
node; both must come from a real cluster, reproducibly. This brings up the
e2e tier's control plane (tests/harness/cluster.py: etcd, kube-apiserver, scheduler,
controller-manager) and one simulated node ``node-a`` with the demo's host
profile ``2x-h100-nic`` and the demo's plugin settings (``--mig-gpus=all``,
4 VFs per PF, as hack/simulated-values.yaml), runs four example workloads
of deviceclasses/examples on it (a GPU+VF pair, a GPU, a 1g and a 3g MIG
slice), waits for them to run, and writes what the installed
``kubectl-patchbay`` prints: ``nodes`` (to stdout) and ``topology node-a
--svg`` (to docs/img/topology-node-a.svg by default). Everything is torn
down at the end. No root needed; the real-node tier is not involved.

    .venv/bin/python hack/topology_svg.py [--out docs/img/topology-node-a.svg]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.harness import poll
from tests.harness.cluster import LocalCluster, bin_dir
from tests.harness.simnode import (
    PLUGIN_IDENTITY,
    SimNode,
    apply_deviceclasses,
    apply_plugin_rbac,
    build_nvml_mock,
)

REPO = Path(__file__).resolve().parents[2]
RUN = Path(os.environ.get("PATCHBAY_SVG_RUN_DIR", "/tmp/pb-svg"))  # short: socket paths
SCRIPT = Path(sys.executable).parent / "kubectl-patchbay"
NODE, NS = "node-a", "demo"
EXAMPLES = REPO / "deviceclasses" / "examples"
# Where each lands is the real scheduler's first fit over the plugin's order.
WORKLOADS = ("gpu-vf-pair.yaml", "single-gpu.yaml", "mig-1g.yaml", "mig-3g.yaml")


def wait(what: str, probe: Callable[[], object], timeout: float = 120) -> None:
    try:
        poll.wait_for(what, probe, timeout)
    except poll.WaitTimedOut as timed_out:
        raise SystemExit(str(timed_out)) from None


def patchbay(cluster: LocalCluster, *args: str) -> str:
    cmd = [str(SCRIPT), "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def published(cluster: LocalCluster) -> tuple[int, int]:
    for view in json.loads(patchbay(cluster, "nodes", "-o", "json")):
        if view["node"] == NODE:
            return view["devices"]["gpu"]["total"], view["devices"]["vf"]["total"]
    return 0, 0


def run_workloads(api: client.ApiClient) -> list[str]:
    """The examples' templates and pods on ``node-a``, one pod at a time (a
    template without a pod, mig-3g's, gets a pause pod of its own)."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    core.create_namespace({"metadata": {"name": NS}})
    wait("the default service account", lambda: core.list_namespaced_service_account(NS).items)
    pods = []
    for name in WORKLOADS:
        docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
        (tmpl,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
        resource.create_namespaced_resource_claim_template(NS, tmpl)
        pod = next((d for d in docs if d["kind"] == "Pod"), None) or pause_pod(tmpl)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
        core.create_namespaced_pod(NS, pod)
        pods.append(pod["metadata"]["name"])
        wait(f"{pods[-1]} Running", lambda: _phase(core, pods[-1]) == "Running")
    return pods


def pause_pod(tmpl: dict[str, Any]) -> dict[str, Any]:
    name = tmpl["metadata"]["name"]
    container = {"name": "main", "image": "pause", "resources": {"claims": [{"name": "c"}]}}
    claims = [{"name": "c", "resourceClaimTemplateName": name}]
    return {
        "metadata": {"name": f"{name}-job"},
        "spec": {"containers": [container], "resourceClaims": claims},
    }


def _phase(core: client.CoreV1Api, pod: str) -> str:
    return str(core.read_namespaced_pod(pod, NS).status.phase)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "topology-node-a.svg")
    args = p.parse_args(argv)
    build_nvml_mock()
    shutil.rmtree(RUN, ignore_errors=True)  # a fresh run: the host trees are built anew
    cluster = LocalCluster(RUN, bin_dir(build=True))
    cluster.up()
    node = None
    try:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        apply_plugin_rbac(cluster.kubeconfig)
        apply_deviceclasses(client.ResourceV1Api(api))
        vf_config = RUN / "vf.yaml"
        vf_config.write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
        kubeconfig = cluster.kubeconfig_for(*PLUGIN_IDENTITY)
        plugin_args = (f"--vf-config={vf_config}", "--mig-gpus=all")
        node = SimNode(cluster, NODE, "2x-h100-nic", kubeconfig, plugin_args).start()
        wait(f"{NODE}'s 4 GPUs and 8 VFs", lambda: published(cluster) == (4, 8))
        pods = run_workloads(api)
        print(f"$ kubectl patchbay nodes    # pods {', '.join(pods)}")
        print(patchbay(cluster, "nodes"), end="")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tree = patchbay(cluster, "topology", NODE, "--svg", str(args.out))
        print(f"$ kubectl patchbay topology {NODE} --svg {args.out.name}")
        print(tree, end="")
    finally:
        if node is not None:
            node.stop()
        cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
