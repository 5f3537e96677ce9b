"""``make demo``: patchbay installed with helm on real nodes, workloads as real containers.

Brings up the control plane and two real nodes (tests/harness/realnode.py: kubelet,
containerd, runc, kube-proxy in namespaces of their own; node-a with 4 H100
on two PCIe roots, each with a NIC's VFs; node-c GPU-less, with a NIC and two
fabric adapters), installs ``helm/patchbay`` with the controller and the
simulated CXL fabric (GPUs, an NVMe drive, CXL Type 3 memory) and one warm
spare per node (:mod:`tests.harness.demo_spare`: a pod takes it and runs
without waiting for an attach, and the spare is replaced), runs the
example workloads of ``deviceclasses/examples/`` and prints what each
container saw (its own output, through ``kubectl logs``), which devices the
fabric attached, and the event of a claim whose config is wrong; then one
device lease expiring (:mod:`tests.harness.demo_lease`: ``kubectl patchbay
leases``, the warning, the eviction, the release). Everything
keeps running after the script ends; ``make demo-down`` (this script's
``down``) stops it all and puts the machine back as it was.
Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.harness import demo_lease, demo_spare, poll, realnode, realnode_chart

REPO = Path(__file__).resolve().parents[2]
# Short on purpose: Unix socket paths below it must stay under 107 bytes.
RUN = Path(os.environ.get("PATCHBAY_DEMO_DIR", "/tmp/patchbay-demo"))
EXAMPLES = REPO / "deviceclasses" / "examples"
# In this order: local GPUs first, then MIG on the last local GPU, then the
# fabric, each device published once (the chart's default shape, per-domain;
# node-c carries its reach labels, tests/harness/realnode.py): a GPU attached
# to node-c, a GPU + VF pair through the adapter on the VF's root, a GPU +
# NVMe drive through one adapter for GPUDirect Storage, a GPU + CXL memory
# behind one adapter.
WORKLOADS = (
    ("single-gpu.yaml", "node-a"),
    ("two-gpus.yaml", "node-a"),
    ("mig-1g.yaml", "node-a"),
    ("mig-profile-cel.yaml", "node-a"),
    ("fabric-gpu.yaml", None),
    ("fabric-gpu-vf-pair.yaml", "node-c"),
    ("gpu-nvme-gds.yaml", None),
    ("gpu-cxl-memory.yaml", None),
)
NS = "demo"


def docs(name: str, node: str | None) -> list[dict[str, Any]]:
    out = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    for d in out:
        if d["kind"] == "Pod" and node:
            d["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return out


def bad_config() -> list[dict[str, Any]]:
    """A claim whose GpuConfig has a field that does not exist (node-a's GPUs are
    taken by then: it gets one of the fabric's GPUs on node-c)."""
    tmpl, pod = docs("single-gpu.yaml", "node-c")
    tmpl["metadata"]["name"] = "typo"
    tmpl["spec"]["spec"]["devices"]["config"] = [{"opaque": {"driver": "patchbay.dev",
        "parameters": {"apiVersion": "patchbay.dev/v1alpha1", "kind": "GpuConfig",
                       "driverCapabilitys": ["compute"]}}}]  # fmt: skip
    pod["metadata"]["name"] = "typo-job"
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "typo"
    return [tmpl, pod]


def seen(cluster: realnode.RealCluster, pod: str) -> str:
    lines = cluster.kubectl("logs", pod, "-n", NS, check=False).stdout.splitlines()
    env = [ln for ln in lines if "=" in ln]
    nodes = [ln for ln in lines if ln.startswith("/dev/")]
    return "; ".join(env) + ("; " if env and nodes else "") + " ".join(nodes)


def report(cluster: realnode.RealCluster, pods: list[str]) -> None:
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    devices = {(s["spec"]["pool"]["name"], d["name"]): d
               for s in slices for d in s["spec"].get("devices", [])}  # fmt: skip
    print(f"\n{'pod':16} {'phase':8} {'node':7} {'pool':24} {'device':30} {'pcieRoot':11}")
    for name in pods:
        pod = json.loads(cluster.kubectl("get", "pod", name, "-n", NS, "-o", "json").stdout)
        phase, node = pod["status"].get("phase", "?"), pod["spec"].get("nodeName", "-")
        claims = pod["status"].get("resourceClaimStatuses", [])
        results: list[dict[str, Any]] = []
        if claims:
            name_ = claims[0]["resourceClaimName"]
            claim = json.loads(
                cluster.kubectl("get", "resourceclaim", name_, "-n", NS, "-o", "json").stdout
            )
            alloc = claim.get("status", {}).get("allocation")
            results = alloc["devices"]["results"] if alloc else []
        for r in results or [{"pool": "-", "device": "-"}]:
            attrs = devices.get((r["pool"], r["device"]), {}).get("attributes", {})
            root = attrs.get("resource.kubernetes.io/pcieRoot", {}).get("string", "-")
            print(f"{name:16} {phase:8} {node:7} {r['pool']:24} {r['device']:30} {root:11}")
        if phase == "Running":
            print(f"{'':16} container saw: {seen(cluster, name)}")


def up() -> int:
    down(quiet=True)
    cluster = realnode.RealCluster(RUN, realnode.DEFAULT_NODES)
    cluster.up(detach=True)
    print(f"control plane and {len(cluster.nodes)} real nodes Ready in "
          f"{cluster.startup_seconds:.1f}s")  # fmt: skip
    release = realnode_chart.Release(cluster.kubeconfig, RUN / "chart", None)
    values = RUN / "chart" / "demo-values.yaml"  # the fabric, and a warm spare per node
    values.parent.mkdir(parents=True, exist_ok=True)
    values.write_text(yaml.safe_dump(demo_spare.values(demo_spare.NODE)))
    release.values.append(values)
    lease_values = RUN / "chart" / "demo-lease-values.yaml"  # the lease clock on
    lease_values.write_text(yaml.safe_dump(demo_lease.VALUES))
    release.values.append(lease_values)
    t0 = time.monotonic()
    release.install()
    print(f"helm install patchbay: plugin, controller and fabric Ready in "
          f"{time.monotonic() - t0:.1f}s")  # fmt: skip
    cluster.kubectl("create", "namespace", NS)
    demo_spare.wait(  # the controller-manager makes its default ServiceAccount
        f"the default ServiceAccount in namespace {NS}",
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", NS, check=False).returncode
            == 0
            or None
        ),
        60,
    )
    pods = [demo_spare.take_a_spare(cluster, NS)]
    for name, node in WORKLOADS:
        objs = docs(name, node)
        cluster.kubectl("apply", "-n", NS, "-f", "-", check=True,
                        stdin=yaml.safe_dump_all(objs))  # fmt: skip
        pods += [d["metadata"]["name"] for d in objs if d["kind"] == "Pod"]
    cluster.kubectl("apply", "-n", NS, "-f", "-", stdin=yaml.safe_dump_all(bad_config()))

    def all_running() -> bool:
        out = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-o", "json").stdout)
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in out["items"]}
        return all(phases.get(p) == "Running" for p in pods)

    poll.until(all_running, 180, interval=1)  # the report shows any that are not
    demo_lease.start(cluster)  # after the others: its MIG slice takes no GPU they need
    report(cluster, pods)
    # A fabric pod that waited for its attach binds at the scheduler's next
    # 5 s re-check; one that took a warm spare binds at once.
    print(f"\n{'fabric pod':16} allocation to Running (whole seconds), binding conditions")
    for line in filter(None, (demo_spare.binding_line(cluster, NS, p) for p in pods)):
        print(line)
    events = poll.until(lambda: cluster.kubectl(
        "get", "events", "-n", NS, "--field-selector",
        "involvedObject.name=typo-job,reason=FailedPrepareDynamicResources",
        "-o", "jsonpath={.items[*].message}").stdout, 60, interval=1)  # fmt: skip
    print(f"\ntypo-job (GpuConfig with a misspelt field) stays Pending:\n  {events or '-'}")
    demo_lease.watch_expiry(cluster)
    print(f"\nexport KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={cluster.k8s_bins}:$PATH   # kubectl {cluster.k8s_bins / 'kubectl'}")
    print("Tear down with: make demo-down")
    return 0


def down(quiet: bool = False) -> int:
    killed = realnode.RealCluster(RUN).down()
    if killed:  # a component that ignores SIGTERM is a bug of its launch, not of the host
        print(f"demo stopped, but these ignored SIGTERM and were killed: {', '.join(killed)}")
        return 1
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
