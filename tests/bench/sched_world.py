"""The scheduler bench's cluster: hand-made Ready nodes and the slices published for them.

tests/bench/sched_bench.py measures the real kube-scheduler; this module
makes what it schedules onto: nodes without kubelets (a thread renews their
Leases and Ready heartbeats, as kubelets would), each node's local GPU pool
as the plugin publishes it, and the fabric pool as the controller's own
pool and slice builders make it (node-major, or the GPU-major what-if).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from driver import DRIVER_NAME
from driver.controller.pool.devices import build_pool
from driver.devices.model import ATTACHMENT, PCI_BUS_ID, PCIE_ROOT, AttributeValue, Device
from driver.fabric_devices.naming import NodeFabric
from driver.fabricclient.model import FabricDevice, FabricInventory, HostAdapter
from driver.slices.build import PoolSpec, build_slices, slice_object
from tests.e2e.helpers import make_node

FABRIC_POOL = "fabric"
FABRIC_ROOT = "pci0000:15"
LEASE_NS = "kube-node-lease"

Obj = dict[str, Any]


def stamp(micro: bool = False) -> str:
    now = time.time()
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return f"{base}.{int(now % 1 * 1e6):06d}Z" if micro else f"{base}Z"


# -- nodes -------------------------------------------------------------------


def make_leased_node(
    core: client.CoreV1Api, coord: client.CoordinationV1Api, name: str,
    labels: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """A Ready node without a kubelet, and its Lease, as its kubelet would make them
    (``labels``: more, as provisioning sets them)."""
    make_node(core, name, {"kubernetes.io/hostname": name, **(labels or {})})
    coord.create_namespaced_lease(LEASE_NS, {
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                 "renewTime": stamp(micro=True)},
    })  # fmt: skip


def renew(core: client.CoreV1Api, coord: client.CoordinationV1Api, node: str, status: bool) -> None:
    """Renew a node's Lease and, with `status`, its Ready heartbeat, as its kubelet
    would; an ApiException is the caller's to count."""
    coord.patch_namespaced_lease(node, LEASE_NS, {"spec": {"renewTime": stamp(micro=True)}})
    if status:
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        core.patch_node_status(
            node, {"status": {"conditions": [{**ready, "lastHeartbeatTime": stamp()}]}}
        )


class Heartbeat(threading.Thread):
    """Renews each node's Lease and Ready heartbeat, as kubelets would."""

    def __init__(self, api: client.ApiClient, nodes: list[str], every: float = 10.0) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.core, self.coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.nodes, self.every = nodes, every
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.beat()

    def beat(self) -> None:
        for node in self.nodes:
            try:
                renew(self.core, self.coord, node, status=True)
            except ApiException:
                self.errors += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def make_nodes(api: client.ApiClient, names: list[str]) -> None:
    core, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
    for name in names:
        make_leased_node(core, coord, name)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # the node lifecycle controller lifts not-ready
        if not any(n.spec.taints for n in core.list_node().items):
            return
        time.sleep(0.5)
    print("warning: some nodes still carry taints after 90 s", flush=True)


# -- slices ------------------------------------------------------------------


def local_slices(node: str, gpus: int) -> list[Obj]:
    """A node's own GPUs as the plugin publishes them (pool = node name)."""
    devices = []
    for i in range(gpus):
        attrs: dict[str, AttributeValue] = {
            "uuid": f"GPU-{node}-{i}", "index": i, "productName": "NVIDIA H100 80GB HBM3",
            ATTACHMENT: "local", PCI_BUS_ID: f"0000:{0x18 + i:02x}:00.0",
            PCIE_ROOT: f"pci0000:{0x17 + i:02x}",
        }  # fmt: skip
        devices.append(
            Device(f"gpu-{i}", "gpu", f"GPU-{node}-{i}", attrs, capacity={"memory": "81559Mi"})
        )
    spec = PoolSpec(DRIVER_NAME, node, f"{node}-patchbay", {"nodeName": node}, tuple(devices))
    desired = build_slices(spec)
    return [slice_object(spec, d, 1, len(desired)) for d in desired]


def fabric_gpu(i: int, adapters: tuple[HostAdapter, ...]) -> FabricDevice:
    return FabricDevice(
        f"gpu-{i:04d}", "pcie0", "sw0", "gpu", "H100-SXM5-80GB", f"S{i:04d}", f"GPU-fab-{i:04d}",
        0x10DE, 0x2330, "OK", True, False, adapters, None,
    )  # fmt: skip


def fabric_world(gpus: int, nodes: list[str]) -> tuple[FabricInventory, dict[str, NodeFabric]]:
    """`gpus` fabric GPUs on one switch, each reachable from every node through
    the node's adapter0, and each node's report of that adapter (its root)."""
    adapters = tuple(HostAdapter(f"{n}-a0", "pcie0", "sw0", n, "adapter0") for n in nodes)
    devices = tuple(fabric_gpu(i, adapters) for i in range(gpus))
    reports = {n: NodeFabric({"adapter0": FABRIC_ROOT}) for n in nodes}
    return FabricInventory(devices, adapters), reports


def fabric_spec(gpus: int, nodes: list[str], layout: str) -> PoolSpec:
    """The controller's fabric pool: `gpus` GPUs, each reachable from every node.

    ``node-major`` (one node's variants per slice) is what the controller
    publishes; ``gpu-major`` (all variants of a few GPUs per slice, what
    the architecture first proposed) is the what-if for comparison.
    """
    inventory, reports = fabric_world(gpus, nodes)
    devices = inventory.devices
    spec, _ = build_pool(FABRIC_POOL, inventory, reports, (), ())
    if layout == "gpu-major":
        per = max(1, 64 // len(nodes))  # whole GPUs per slice
        order = {d.id: i // per for i, d in enumerate(devices)}
        gpu_of = {d.name: str(d.attributes["fabricDevice"]) for d in spec.devices}
        spec = dataclasses.replace(
            spec,
            devices=tuple(sorted(spec.devices, key=lambda d: order[gpu_of[d.name]])),
            slice_of={d.name: order[gpu_of[d.name]] for d in spec.devices},
        )
    return spec


def publish_fabric(
    res: client.ResourceV1Api, spec: PoolSpec, generation: int, previous: list[str]
) -> tuple[list[str], float]:
    """Replace the fabric pool's slices; the new names and the API seconds."""
    desired = build_slices(spec)
    start = time.monotonic()
    for name in previous:
        res.delete_resource_slice(name, _preload_content=False)
    for d in desired:
        body = slice_object(spec, d, generation, len(desired))
        res.create_resource_slice(body, _preload_content=False)
    return [d.name for d in desired], time.monotonic() - start
