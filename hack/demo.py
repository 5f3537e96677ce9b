"""``make demo``: patchbay at work on a local cluster, then a teardown hint.

Brings up the real control plane (hack/cluster.py), two simulated GPU nodes
(node-a: 4 x H100 one per root complex; node-b: 2 GPUs), each with the node
agent and a real plugin process, applies ``deviceclasses/`` and an example
workload, and prints which pod got which GPU. Everything keeps running
after the script ends so you can look around with the printed KUBECONFIG;
``make demo-down`` (this script's ``down``) stops it all.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import cluster as localk8s
from cluster_proc import load_pids, save_pids, stop_group
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from simnode import SimNode, apply_deviceclasses, apply_plugin_rbac, build_nvml_mock

REPO = Path(__file__).resolve().parent.parent
# Short on purpose: Unix socket paths below it must stay under 107 bytes.
RUN = Path(os.environ.get("PATCHBAY_DEMO_DIR", "/tmp/patchbay-demo"))
NODES = {"node-a": "4x-h100", "node-b": "2-gpus"}
# Seven GPUs asked for, six exist: one pod waits until another finishes.
PODS = {"trainer-0": 1, "trainer-1": 1, "trainer-2": 2, "notebook": 1, "big": 2}


def workload(core: client.CoreV1Api, res: client.ResourceV1Api) -> None:
    core.create_namespace({"metadata": {"name": "demo"}})
    for count in sorted(set(PODS.values())):
        res.create_namespaced_resource_claim_template("demo", {
            "metadata": {"name": f"gpus-{count}"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.patchbay.dev", "allocationMode": "ExactCount",
                "count": count}}]}}},
        })  # fmt: skip
    for name, count in PODS.items():
        for _ in range(50):  # the namespace's default ServiceAccount comes first
            try:
                core.create_namespaced_pod("demo", {
                    "metadata": {"name": name},
                    "spec": {
                        "containers": [{"name": "main", "image": "pause",
                                        "resources": {"claims": [{"name": "gpu"}]}}],
                        "resourceClaims": [{"name": "gpu",
                                            "resourceClaimTemplateName": f"gpus-{count}"}],
                    },
                })  # fmt: skip
                break
            except ApiException as exc:
                if exc.status != 403:
                    raise
                time.sleep(0.2)


def report(core: client.CoreV1Api, res: client.ResourceV1Api, sims: dict[str, SimNode]) -> None:
    devices = {
        (s.spec.pool.name, d.name): d
        for s in res.list_resource_slice().items
        for d in s.spec.devices or []
    }
    print(f"\n{'pod':12} {'phase':8} {'node':8} {'device':7} {'pcieRoot':12} GPU UUID")
    for pod in core.list_namespaced_pod("demo").items:
        rows = []
        for st in pod.status.resource_claim_statuses or []:
            claim = res.read_namespaced_resource_claim(st.resource_claim_name, "demo")
            alloc = claim.status.allocation if claim.status else None
            for r in alloc.devices.results if alloc else []:
                dev = devices.get((r.pool, r.device))
                attrs = dev.attributes if dev else {}
                rows.append((r.pool, r.device, attrs.get("resource.kubernetes.io/pcieRoot"),
                             attrs.get("uuid")))  # fmt: skip
        if not rows:
            rows = [("-", "-", None, None)]
        for node, device, root, uuid in rows:
            print(f"{pod.metadata.name:12} {pod.status.phase:8} {node:8} {device:7} "
                  f"{root.string if root else '-':12} {uuid.string if uuid else '-'}")  # fmt: skip
    for name, sim in sims.items():
        for pod in core.list_namespaced_pod("demo").items:
            rec = sim.agent.pod_record("demo", pod.metadata.name)
            if rec:
                cdi = [i for c in rec["containers"].values() for i in c["cdiDevices"]]  # type: ignore[union-attr]
                print(f"  {name}: {pod.metadata.name} container CDI devices: {', '.join(cdi)}")


def up() -> int:
    build_nvml_mock()
    down(quiet=True)
    cluster = localk8s.LocalCluster(RUN / "k8s", localk8s.bin_dir(build=True))
    cluster.up(detach=True)
    print(f"control plane ready in {cluster.startup_seconds:.1f}s")
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    apply_plugin_rbac(cluster.kubeconfig)
    apply_deviceclasses(res)
    kubeconfig = cluster.kubeconfig_for("patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",))
    sims = {}
    for name, topo in NODES.items():
        sim = SimNode(cluster, name, topo, kubeconfig)
        sim.agent.start(die_with_parent=False)
        sim.plugin.start()
        sims[name] = sim
    save_pids(RUN / "nodes.json", {
        **{f"agent-{n}": s.agent.component.pid for n, s in sims.items() if s.agent.component},
        **{f"plugin-{n}": s.plugin.proc.pid for n, s in sims.items() if s.plugin.proc},
    })  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        slices = res.list_resource_slice().items
        if sum(len(s.spec.devices or []) for s in slices) == 6:
            break
        time.sleep(0.5)
    print(
        f"published: {', '.join(f'{s.spec.pool.name}={len(s.spec.devices)} GPUs' for s in slices)}"
    )
    workload(core, res)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        phases = [p.status.phase for p in core.list_namespaced_pod("demo").items]
        if phases.count("Running") == len(PODS) - 1:
            break
        time.sleep(0.5)
    report(core, res, sims)
    print(
        "\nSeven GPUs were asked for and six exist, so one pod waits (Pending);"
        " delete a Running pod and it starts."
    )
    print(f"\nexport KUBECONFIG={cluster.kubeconfig}\nTear down with: make demo-down")
    return 0


def down(quiet: bool = False) -> int:
    pids = load_pids(RUN / "nodes.json") if (RUN / "nodes.json").exists() else {}
    for name, pid in pids.items():
        stop_group(pid, name)
    (RUN / "nodes.json").unlink(missing_ok=True)
    localk8s.LocalCluster(RUN / "k8s").down()
    if not quiet:
        print("demo stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down"), nargs="?", default="up")
    args = parser.parse_args(argv)
    return up() if args.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
