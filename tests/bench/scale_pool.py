"""Each hollow node's pool for the scale bench, built by the plugin's own code.

Why: the scale bench (``scale_bench``) must load the control plane with the
slices our plugin really publishes, at hundreds or thousands of nodes,
without a plugin process per node. So one simulated host (``fabric.simhost``,
by default ``2x-h100-nic``: 4 x H100, a NIC PF with VFs under each root that
holds two of the GPUs) gives the sysfs tree, and per node the plugin's own
device families scan it (``GpuType`` with dynamic MIG and fractional shares,
``VfType``), the pool spec is made as ``plugin.app.NodePlugin.publish``
makes it (pool = node name, owner = the Node) and split by the plugin's own
``driver.slices.build``. The one stand-in: NVML is the in-memory fake
(``driver.nvml.fake``, contract-tested against the C mock the plugin
process uses) with each node's own GPU UUIDs, so no two nodes' pools are
byte-identical copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver import DRIVER_NAME
from driver.checkpoint import CheckpointStore
from driver.devices.kind import DeviceType, scan_all
from driver.gpu.fraction import SharePolicy
from driver.gpu.kind import GpuType
from driver.kube.objects import owner_reference
from driver.mig.discovery import mig_support
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices.build import PoolSpec, build_slices, slice_name_prefix, slice_object
from driver.slices.order import node_order
from driver.vf.config import PfPoolConfig, PfSelector
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.bench.rundir import bench_dir

Obj = dict[str, Any]
BOOT_ID = "00000000-0000-4000-8000-000000000001"


@dataclass(frozen=True)
class NodeFlavor:
    """What the plugin is told to offer (its flags of the same names)."""

    mig_gpus: str = "all"  # --mig-gpus
    shared_gpus: str = "all"  # --shared-gpus
    vfs: bool = True  # --vf-config selecting the Mellanox PFs
    mig_media_extensions: bool = True  # --mig-media-extensions


MIG_NODE = NodeFlavor()
PLAIN_NODE = NodeFlavor(mig_gpus="", shared_gpus="", vfs=False)
MIG_ONLY = NodeFlavor(shared_gpus="", vfs=False)  # issue 26's "4 x H100, dynamic MIG"


def plugin_args(flavor: NodeFlavor, vf_config: Path) -> tuple[str, ...]:
    """The same flavor as flags of a real plugin process."""
    args = [f"--mig-media-extensions={str(flavor.mig_media_extensions).lower()}"]
    if flavor.mig_gpus:
        args.append(f"--mig-gpus={flavor.mig_gpus}")
    if flavor.shared_gpus:
        args.append(f"--shared-gpus={flavor.shared_gpus}")
    if flavor.vfs:
        vf_config.write_text("pfs:\n  - vendorID: '15b3'\n")
        args.append(f"--vf-config={vf_config}")
    return tuple(args)


class HostPools:
    """Per-node pools over one simulated host's tree."""

    def __init__(self, topology: str = "2x-h100-nic", work: Path | None = None) -> None:
        self.work = work or bench_dir("scale-host-")
        self.host = SimHost.build(TOPOLOGIES[topology](), self.work / "host", name="template")
        self.gpus = self.host.nvml.read()["gpus"]

    def families(self, node: str, flavor: NodeFlavor) -> list[DeviceType]:
        """The plugin's device families for ``node``, as its flags in ``flavor`` make them."""
        machine = FakeMachine()
        for g in self.gpus:  # the host's GPUs, with this node's own UUIDs
            uuid = f"GPU-{node}-{g['uuid'][-12:]}"[:40]
            machine.add_gpu(uuid, g["model"], g["pci_bus_id"], serial=g["serial"], minor=g["minor"])
        nvml = FakeNvml(machine)
        store = CheckpointStore(self.work / f"checkpoint-{node}.json", BOOT_ID)
        mig = mig_support(
            nvml, flavor.mig_gpus, "", flavor.mig_media_extensions, False,
            dev_root=self.host.dev_root, checkpoint=store, shared_checkpoint=False,
        )  # fmt: skip
        families: list[DeviceType] = [
            GpuType(
                nvml, self.host.sysfs_root, self.host.dev_root, mig=mig, events=nvml,
                share=SharePolicy.parse(flavor.shared_gpus, 1024),
                state_dir=self.work / "state",
            ),
        ]  # fmt: skip
        if flavor.vfs:
            from driver.vf.kind import VfType

            config = PfPoolConfig(pfs=[PfSelector(vendorID="15b3")])
            families.append(VfType(config, self.host.sysfs_root, self.host.dev_root))
        return families

    def spec(self, node: Obj, flavor: NodeFlavor) -> PoolSpec:
        """The pool spec the plugin publishes for ``node`` (a Node object as JSON)."""
        name = node["metadata"]["name"]
        found = scan_all(self.families(name, flavor))
        return PoolSpec(
            driver=DRIVER_NAME,
            pool_name=name,
            name_prefix=slice_name_prefix(name, DRIVER_NAME),
            node_selection={"nodeName": name},
            devices=tuple(node_order(found.devices)),
            counter_sets=found.counter_sets,
            owner=owner_reference(node),
        )

    def slices(self, node: Obj, flavor: NodeFlavor) -> list[Obj]:
        """The ResourceSlice objects for ``node``, generation 1."""
        spec = self.spec(node, flavor)
        desired = build_slices(spec)
        return [slice_object(spec, d, 1, len(desired)) for d in desired]
