"""Fabric objects for the controller's unit tests: GPUs as a fabric manager
lists them, and one attach's objects: the variant (gpu-0 behind node-a's
adapter0), its fabric GPU, the claim allocating it and node-a's report.

Why: the attach workers' tests, and the ones for events, retries, fabric
trouble, zones, the pool and warm spares, start from the same objects; they
live here once. (tests/unit/test_controller_pool.py still defines its own
``gpu``, the same as :func:`reachable_gpu`, until its pending change lands.)
"""

from __future__ import annotations

from typing import Any, Literal

from driver.controller import claims as cl
from driver.controller.pool.variant import Variant
from driver.fabric_devices.naming import (
    NODE_ANNOTATION,
    NodeFabric,
)
from driver.fabricclient.model import FabricDevice, HostAdapter

Health = Literal["OK", "Warning", "Critical"]
VARIANT = Variant("fgpu-1", "gpu-0", "gpu", "GPU-0", "node-a", "adapter0", "pci0000:15")
ADAPTER = HostAdapter("node-a-a0", "pcie0", "sw0", "node-a", "adapter0")
GPU = FabricDevice(
    "gpu-0", "pcie0", "sw0", "gpu", "H100-SXM5-80GB", "S1", "GPU-0", 0x10DE, 0x2330,
    "OK", True, False, (ADAPTER,), None,
)  # fmt: skip
CLAIM = {
    "metadata": {"name": "claim", "uid": "uid-1"},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric",
                     "device": "fgpu-1"}
                ]
            }
        }
    },
}  # fmt: skip
ALLOC = cl.FabricAllocation("uid-1", "default", "claim", "fgpu-1", ready=False, failed=False)


def node(gpus: dict[str, str]) -> dict[str, Any]:
    report = NodeFabric({"adapter0": "pci0000:15"}, gpus=gpus).to_annotation()
    return {"metadata": {"name": "node-a", "annotations": {NODE_ANNOTATION: report}}}


def reachable_gpu(ident: str, nodes: tuple[str, ...], health: Health = "OK") -> FabricDevice:
    """An H100 that each of ``nodes`` reaches through its adapter0."""
    adapters = tuple(HostAdapter(f"{n}-a0", "pcie0", "sw0", n, "adapter0") for n in nodes)
    return FabricDevice(
        ident, "pcie0", "sw0", "gpu", "H100-SXM5-80GB", "S1", f"GPU-{ident}", 0x10DE, 0x2330,
        health, True, False, adapters, None,
    )  # fmt: skip
