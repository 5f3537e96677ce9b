"""A burst of pods on two simulated nodes: the workload, its creation and its settling.

Why this module exists: the burst e2e module (tests/e2e/test_burst_e2e.py)
and the burst benchmark (tests/bench/burst_bench.py) create the same burst
on the same nodes: a MIG node (2 x H100, ``--mig-gpus=all``, pods asking for
one 1g partition) and a GPU + VF node (4 x H100 and 2 NIC PFs of 8 VFs, pods
asking for a whole GPU, a netdev VF or a ``vfio-pci`` VF) and, where one is
given, a fabric node (pods asking for a fabric GPU); many more pods than
fit. What is audited afterwards lives in tests/e2e/burst_audit.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.plugin_nodes import plugin_node
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import SimNode

VFS_PER_PF = 8
VFIO = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig", "mode": "vfio-pci"}


@dataclass(frozen=True)
class Kind:
    """One kind of pod in the burst: its template, its node and how many fit."""

    name: str
    node: str  # "mig", "vf" or "fabric": the role of the node it is pinned to
    device_class: str
    pods: int
    pool: str  # the capacity it shares with other kinds (they compete for it)
    config: tuple[tuple[str, Any], ...] = ()


KINDS = (
    Kind("mig", "mig", "mig-1g.patchbay.dev", 40, "mig-1g"),
    Kind("gpu", "vf", "gpu.patchbay.dev", 20, "gpu"),
    Kind("vf", "vf", "vf.patchbay.dev", 20, "vf"),
    Kind("vfio", "vf", "vf.patchbay.dev", 20, "vf", (("mode", "vfio-pci"),)),
)
# With a fabric node, ten of the whole-GPU pods ask it for a fabric GPU instead.
FABRIC = Kind("fabric", "fabric", "gpu.patchbay.dev", 10, "fabric")
# How many pods of each capacity pool the nodes hold at once: 7 x 1g per H100,
# 4 GPUs, 2 PFs x 8 VFs, the 3 fabric GPUs a fabric node of the e2e tier's
# fabric reaches (tests/e2e/conftest.py).
CAPACITY = {"mig-1g": 2 * 7, "gpu": 4, "vf": 2 * VFS_PER_PF, "fabric": 3}
PODS = sum(k.pods for k in KINDS)
NODE_DEVICES = {"mig": 2 * (1 + 7 + 1 + 4 + 3 + 2 + 1 + 1), "vf": 4 + 2 * VFS_PER_PF}


@dataclass
class BurstNodes:
    """The nodes by role ("mig", "vf", and "fabric" if one is given)."""

    by_role: dict[str, SimNode]

    @property
    def kinds(self) -> tuple[Kind, ...]:
        if "fabric" not in self.by_role:
            return KINDS
        return (*(replace(k, pods=10) if k.name == "gpu" else k for k in KINDS), FABRIC)

    @property
    def capacity(self) -> dict[str, int]:
        return {k.pool: CAPACITY[k.pool] for k in self.kinds}

    @property
    def pods(self) -> int:
        return sum(k.pods for k in self.kinds)

    def with_fabric(self, node: SimNode) -> BurstNodes:
        return BurstNodes({**self.by_role, "fabric": node})

    def __iter__(self) -> Iterator[SimNode]:
        return iter(self.by_role.values())

    def role_of(self, node_name: str) -> str:
        return next(r for r, n in self.by_role.items() if n.name == node_name)


@contextlib.contextmanager
def burst_nodes(
    cluster: LocalCluster,
    resource_api: client.ResourceV1Api,
    core: client.CoreV1Api,
    work: Path,
    extra_args: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[BurstNodes]:
    """The MIG node and the GPU + VF node, started, their devices published
    (``extra_args``: more plugin arguments by role)."""
    more = extra_args or {}
    vf_config = work / "vf.yaml"
    vf_config.write_text(f"pfs:\n  - vendorID: '15b3'\n    numVfs: {VFS_PER_PF}\n")
    with (
        plugin_node(
            cluster, resource_api, core, "bmig", "2-gpus",
            args=("--mig-gpus=all", *more.get("mig", ())),
            ready=lambda n: n == NODE_DEVICES["mig"], what="MIG devices of the burst published",
        ) as mig,
        plugin_node(
            cluster, resource_api, core, "bvf", "2x-h100-nic",
            args=(f"--vf-config={vf_config}", *more.get("vf", ())),
            ready=lambda n: n == NODE_DEVICES["vf"], what="GPUs and VFs of the burst published",
        ) as vf,
    ):  # fmt: skip
        yield BurstNodes({"mig": mig, "vf": vf})


def create_templates(resource_api: client.ResourceV1Api, ns: str, kinds: Sequence[Kind]) -> None:
    for kind in kinds:
        request = {"name": "dev", "exactly": {"deviceClassName": kind.device_class}}
        devices: dict[str, Any] = {"requests": [request]}
        if kind.config:
            params = {**VFIO, **dict(kind.config)}
            opaque = {"driver": "patchbay.dev", "parameters": params}
            devices["config"] = [{"requests": ["dev"], "opaque": opaque}]
        body = {"metadata": {"name": kind.name}, "spec": {"spec": {"devices": devices}}}
        resource_api.create_namespaced_resource_claim_template(ns, body)


def pod_names(kinds: Sequence[Kind]) -> list[tuple[str, Kind]]:
    """Every pod of the burst, the kinds interleaved (as a burst arrives)."""
    out: list[tuple[str, Kind]] = []
    for i in range(max(k.pods for k in kinds)):
        out += [(f"{k.name}-{i:02d}", k) for k in kinds if i < k.pods]
    return out


def pod_body(name: str, kind: Kind, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"burst-kind": kind.name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "main", "image": "pause", "resources": {"claims": [{"name": "dev"}]}}
            ],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": kind.name}],
        },
    }


def create_burst(core: client.CoreV1Api, ns: str, nodes: BurstNodes, threads: int = 10) -> None:
    """Create every pod of the burst at once (``threads`` concurrent creates)."""

    def create(item: tuple[str, Kind]) -> None:
        name, kind = item
        core.create_namespaced_pod(ns, pod_body(name, kind, nodes.by_role[kind.node].name))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, pod_names(nodes.kinds)))


@dataclass
class Settled:
    """Where the burst's pods stand: Running ones and waiting ones (with the
    scheduler's reason), by name."""

    running: dict[str, str]  # pod -> node
    waiting: dict[str, str]  # pod -> "<reason>: <message>"
    other: dict[str, str]  # pod -> what it is instead (e.g. "Pending on node-x")

    def running_per_pool(self, nodes: BurstNodes) -> dict[str, int]:
        kinds = {k.name: k for k in nodes.kinds}
        out = dict.fromkeys(nodes.capacity, 0)
        for name in self.running:
            out[kinds[name.rsplit("-", 1)[0]].pool] += 1
        return out


def settle_state(core: client.CoreV1Api, ns: str) -> Settled:
    s = Settled({}, {}, {})
    for pod in core.list_namespaced_pod(ns).items:
        name, status = pod.metadata.name, pod.status
        conds = {c.type: c for c in status.conditions or []}
        sched = conds.get("PodScheduled")
        if status.phase == "Running" and pod.spec.node_name:
            s.running[name] = pod.spec.node_name
        elif status.phase == "Pending" and sched is not None and sched.status == "False":
            s.waiting[name] = f"{sched.reason}: {sched.message}"
        else:
            s.other[name] = f"{status.phase} on {pod.spec.node_name or 'no node'}"
    return s


def is_settled(s: Settled, pods: int, nodes: BurstNodes) -> bool:
    """Every pod either Running or refused by the scheduler, each pool full."""
    full = s.running_per_pool(nodes) == nodes.capacity
    return not s.other and len(s.running) + len(s.waiting) == pods and full


def delete_pods(core: client.CoreV1Api, ns: str, names: Sequence[str], threads: int = 10) -> None:
    def delete(name: str) -> None:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, ns)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(delete, names))
