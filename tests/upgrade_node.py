"""One simulated node for the checkpoint-format fixture (tests/fixtures/checkpoint-v1).

Why it exists: the fixture's generator (``tests/make_checkpoint_fixture.py``)
and its test (``tests/unit/test_checkpoint_fixture.py``) must see the same
node: the same GPUs in the NVML fake, the same VFs in a simulated sysfs tree,
the same claims (fixed UIDs) and the real handlers the plugin builds. The
generator drives today's code to write the files once; the test reads them
with whatever code is current, so nothing here may depend on the format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.config import opaque
from driver.devices.handler import DeviceHandler
from driver.devices.inventory import NodeInventory
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import scan_vfs
from driver.vf.prepare import VfHandler
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.claims_doubles import Reader

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-v1"
BOOT_ID = "3f7a9b52-0c1d-4e8f-9a6b-2d4c6e8f0a1b"
POOL = "node-a"
MIG_GPU_INDEX = 1  # GPU 0 is handed out whole, GPU 1 partitioned

# name -> (uid, device, opaque parameters or None); fixed, so files compare.
CLAIMS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "whole-gpu": (
        "0b9d5a1e-6c3f-4a2b-8e7d-1f0a9c8b7d60",
        "gpu-0",
        {"kind": "GpuConfig", "driverCapabilities": ["compute", "utility"]},
    ),
    "mig": ("1c8e6b2f-7d4a-4b3c-9f8e-2a1b0d9c8e71", "gpu-1-mig-3g-40gb-4", None),
    "vf": (
        "2d7f5c3a-8e5b-4c4d-8a9f-3b2c1e0d9f82",
        "vf-0000-1a-00-2",
        {"kind": "VfConfig", "mode": "vfio-pci"},
    ),
    # The plugin was killed after binding this VF, before PrepareCompleted.
    "interrupted-vf": (
        "3e6a4d4b-9f6c-4d5e-9b0a-4c3d2f1e0a93",
        "vf-0000-1a-00-3",
        {"kind": "VfConfig", "mode": "vfio-pci"},
    ),
}


def reader() -> Reader:
    """The claims of :data:`CLAIMS` as the apiserver returns them."""
    claims = Reader()
    for name, (uid, device, params) in CLAIMS.items():
        config = []
        if params is not None:
            parameters = {"apiVersion": opaque.API_VERSION, **params}
            config = [
                {
                    "source": "FromClaim",
                    "requests": [],
                    "opaque": {"driver": "patchbay.dev", "parameters": parameters},
                }
            ]
        claims.add(name, {"r": [device]}, pool=POOL, config=config, namespace="upgrade", uid=uid)
    return claims


def ref(name: str) -> ClaimRef:
    return ClaimRef("upgrade", name, CLAIMS[name][0])


class UpgradeNode:
    """The node under ``directory``: sysfs, NVML fake, checkpoint and CDI root."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.host = SimHost.build(TOPOLOGIES["2x-h100-nic"](), directory / "node")
        self.machine = FakeMachine()
        for bdf, uuid in sorted(self.host.gpu_uuids().items()):
            self.machine.add_gpu(uuid, "H100-SXM5-80GB", bdf)
        self.backend = FakeNvml(self.machine)
        self.checkpoint_path = directory / "checkpoint.json"
        self.cdi_root = directory / "cdi"
        self.reader = reader()

    def gpu_uuid(self, index: int) -> str:
        return sorted(self.host.gpu_uuids().items())[index][1]

    def preparer(self) -> ClaimPreparer:
        """A (re)started plugin over this node's files, with the real handlers."""
        store = CheckpointStore(self.checkpoint_path, BOOT_ID)
        missing = self.dir / "no-dev"  # no host /dev: specs carry no host paths
        support = MigSupport(
            NvmlSession(self.backend),
            MigPolicy.parse(str(MIG_GPU_INDEX), "", True, False),
            lambda s, g: MigHandler(s, g, missing),
            lambda: store.load(),
        )
        gpus = GpuType(self.backend, self.host.sysfs_root, missing, mig=support)
        vf_config = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})
        vfs = scan_vfs(self.host.sysfs_root, vf_config)
        inventory = NodeInventory()
        inventory.replace_pool(POOL, [*gpus.discover().devices, *vfs])
        handlers: dict[str, DeviceHandler] = {
            **gpus.handlers(),
            "vf": VfHandler(self.host.sysfs_root, missing, timeout=5.0),
        }
        return ClaimPreparer(self.reader, inventory, handlers, store, CdiRegistry(self.cdi_root))
