"""``make demo``: patchbay at work on a local cluster, then a teardown hint.

Brings up the real control plane (hack/cluster.py), two simulated GPU nodes
(node-a: 4 x H100 one per root complex; node-b: 2 GPUs) and a GPU-less node
(node-c: a NIC with 4 VFs on root pci0000:15 and two fabric adapters), each
with the node agent and a real plugin process, plus the simulated fabric
(``patchbay-fabric``: gpu-0 and gpu-1 behind node-c's adapter0, gpu-2 and a
ConnectX NIC behind adapter1) and ``patchbay-controller``. It applies
``deviceclasses/`` and a workload asking for more GPUs than the nodes have
plus a GPU + VF pair on one PCIe root, and prints which pod got which device
and what the fabric attached. Everything keeps running after the script
ends so you can look around with the printed KUBECONFIG; ``make demo-down``
(this script's ``down``) stops it all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import cluster as localk8s
from cluster_proc import load_pids, save_pids, stop_group
from fabricsim import CONTROLLER_GROUP, ControllerProcess, FabricService, switch
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from simnode import SimNode, apply_deviceclasses, apply_plugin_rbac, apply_rbac, build_nvml_mock

REPO = Path(__file__).resolve().parent.parent
# Short on purpose: Unix socket paths below it must stay under 107 bytes.
RUN = Path(os.environ.get("PATCHBAY_DEMO_DIR", "/tmp/patchbay-demo"))
NODES = {"node-a": "4x-h100", "node-b": "2-gpus", "node-c": "fabric-adapters"}
ADAPTERS = "--fabric-adapters=adapter0=0000:15:02.0,adapter1=0000:85:01.0"
# Seven GPUs asked for (eight with the pair), six are local: the fabric supplies the rest.
PODS = {"trainer-0": 1, "trainer-1": 1, "trainer-2": 2, "notebook": 1, "big": 2}
PAIR = "rdma-pair"  # one GPU + one VF on the same PCIe root


def pair_template(res: client.ResourceV1Api) -> None:
    res.create_namespaced_resource_claim_template("demo", {
        "metadata": {"name": "gpu-vf-pair"},
        "spec": {"spec": {"devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}},
                {"name": "nic", "exactly": {"deviceClassName": "vf.patchbay.dev"}},
            ],
            "constraints": [{"requests": ["gpu", "nic"],
                             "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
        }}},
    })  # fmt: skip


def workload(core: client.CoreV1Api, res: client.ResourceV1Api) -> None:
    core.create_namespace({"metadata": {"name": "demo"}})
    for count in sorted(set(PODS.values())):
        # Local GPUs first; the scheduler prefers nodes where the first choice fits,
        # so the fabric is used only once no node has `count` local GPUs free.
        res.create_namespaced_resource_claim_template("demo", {
            "metadata": {"name": f"gpus-{count}"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "local", "deviceClassName": "local-gpu.patchbay.dev",
                 "allocationMode": "ExactCount", "count": count},
                {"name": "any", "deviceClassName": "gpu.patchbay.dev",
                 "allocationMode": "ExactCount", "count": count},
            ]}]}}},
        })  # fmt: skip
    pair_template(res)
    templates = {name: f"gpus-{count}" for name, count in PODS.items()}
    for name, template in {**templates, PAIR: "gpu-vf-pair"}.items():
        for _ in range(50):  # the namespace's default ServiceAccount comes first
            try:
                core.create_namespaced_pod("demo", {
                    "metadata": {"name": name},
                    "spec": {
                        "containers": [{"name": "main", "image": "pause",
                                        "resources": {"claims": [{"name": "gpu"}]}}],
                        "resourceClaims": [{"name": "gpu",
                                            "resourceClaimTemplateName": template}],
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
    print(f"\n{'pod':10} {'phase':8} {'node':7} {'pool':7} {'device':31} {'pcieRoot':11} uuid/mac")
    for pod in core.list_namespaced_pod("demo").items:
        rows = []
        for st in pod.status.resource_claim_statuses or []:
            claim = res.read_namespaced_resource_claim(st.resource_claim_name, "demo")
            alloc = claim.status.allocation if claim.status else None
            for r in alloc.devices.results if alloc else []:
                dev = devices.get((r.pool, r.device))
                attrs = dev.attributes if dev else {}
                ident = attrs.get("uuid") or attrs.get("macAddress")
                rows.append((r.pool, r.device, attrs.get("resource.kubernetes.io/pcieRoot"),
                             ident))  # fmt: skip
        if not rows:
            rows = [("-", "-", None, None)]
        node = pod.spec.node_name or "-"
        for pool, device, root, ident in rows:
            where = root.string if root else "-"
            print(f"{pod.metadata.name:10} {pod.status.phase:8} {node:7} {pool:7} {device:31} "
                  f"{where:11} {ident.string if ident else '-'}")  # fmt: skip
    for name, sim in sims.items():
        for pod in core.list_namespaced_pod("demo").items:
            rec = sim.agent.pod_record("demo", pod.metadata.name)
            if rec:
                cdi = [i for c in rec["containers"].values() for i in c["cdiDevices"]]  # type: ignore[union-attr]
                print(f"  {name}: {pod.metadata.name} container CDI devices: {', '.join(cdi)}")


def pools(res: client.ResourceV1Api) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in res.list_resource_slice().items:
        out[s.spec.pool.name] = out.get(s.spec.pool.name, 0) + len(s.spec.devices or [])
    return out


def start_fabric(
    cluster: localk8s.LocalCluster, node: SimNode
) -> tuple[FabricService, dict[str, int]]:
    """The simulated fabric and the controller: the fabric, and each one's pid."""
    up = [(node.name, "adapter0", node.host.dir)]
    up1 = [(node.name, "adapter1", node.host.dir)]
    spec = {
        "switches": [
            switch("sw0", up, ["gpu-0", "gpu-1"]),
            switch("sw1", up1, ["gpu-2"], ["nic-0"]),
        ]
    }
    fabric = FabricService(RUN / "fabric", spec).start(attach_latency=1.0)
    apply_rbac(cluster.kubeconfig, "controller.yaml")
    kubeconfig = cluster.kubeconfig_for(
        "patchbay-controller", "patchbay-controller", (CONTROLLER_GROUP,)
    )
    ctl = ControllerProcess(kubeconfig, fabric, RUN / "logs" / "controller.log").start()
    assert fabric.proc is not None and ctl.proc is not None
    return fabric, {"fabric": fabric.proc.pid, "controller": ctl.proc.pid}


def up() -> int:
    build_nvml_mock()
    down(quiet=True)
    # A fresh start: a previous run's etcd data, node hosts and fabric database
    # would clash with the objects and devices created below.
    for stale in ("k8s", "fabric", "logs"):
        shutil.rmtree(RUN / stale, ignore_errors=True)
    cluster = localk8s.LocalCluster(RUN / "k8s", localk8s.bin_dir(build=True))
    cluster.up(detach=True)
    print(f"control plane ready in {cluster.startup_seconds:.1f}s")
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    apply_plugin_rbac(cluster.kubeconfig)
    apply_deviceclasses(res)
    kubeconfig = cluster.kubeconfig_for("patchbay-plugin", "patchbay-plugin", ("patchbay:plugins",))
    vf_config = RUN / "vf.yaml"
    vf_config.write_text("pfs:\n  - vendorID: '15b3'\n    numVfs: 4\n")
    sims = {}
    for name, topo in NODES.items():
        args = (ADAPTERS, f"--vf-config={vf_config}") if topo == "fabric-adapters" else ()
        sim = SimNode(cluster, name, topo, kubeconfig, args)
        sim.agent.start(die_with_parent=False)
        sim.plugin.start()
        sims[name] = sim
    fabric, procs = start_fabric(cluster, sims["node-c"])
    save_pids(RUN / "nodes.json", {
        **{f"agent-{n}": s.agent.component.pid for n, s in sims.items() if s.agent.component},
        **{f"plugin-{n}": s.plugin.proc.pid for n, s in sims.items() if s.plugin.proc},
        **procs,
    })  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        published = pools(res)
        if sum(published.values()) == 6 + 4 + 4:  # local GPUs, node-c's VFs, fabric variants
            break
        time.sleep(0.5)
    print(
        f"published (pool=devices): {', '.join(f'{p}={n}' for p, n in sorted(published.items()))}"
    )
    workload(core, res)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        phases = [p.status.phase for p in core.list_namespaced_pod("demo").items]
        if phases.count("Running") == len(PODS) + 1:
            break
        time.sleep(0.5)
    report(core, res, sims)
    for device, (node, adapter, state) in sorted(fabric.connections().items()):
        print(f"  fabric: {device} {state} to {node} through {adapter}")
    print(
        "\nEight GPUs were asked for and six are local: the controller attached"
        " the rest from the fabric (pool 'fabric') to node-c within the pods'"
        " scheduling cycle; the pair's GPU and VF share one PCIe root."
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
