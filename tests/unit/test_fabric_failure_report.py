"""The node names a failed fabric GPU in its fabric report (issue 38, the fabric path).

The fabric pool is the controller's: the plugin may write only its own
annotations, so an attached fabric GPU its health monitor found failed goes
into its ``patchbay.dev/fabric`` report under ``failed`` (by UUID, with the
class, the taint effect its policy gives the class, the reason and since
when), which the controller reads back as it is written.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from driver.devices.model import ATTACHMENT, Device
from driver.fabric_devices.naming import NODE_ANNOTATION, NodeFabric
from driver.fabric_devices.node import IDENTITY, FabricNodeView, gpu_failures
from driver.health.monitor import HealthMonitor

ATTACHED = Device(
    "fgpu-x-node-a-adapter0", "gpu", "GPU-fab",
    {ATTACHMENT: "fabric", "fabricAdapter": "adapter0", IDENTITY: "GPU-fab"},
)  # fmt: skip
OTHER = Device(
    "fgpu-y-node-a-adapter0", "gpu", "GPU-ok",
    {ATTACHMENT: "fabric", "fabricAdapter": "adapter0", IDENTITY: "GPU-ok"},
)  # fmt: skip


async def test_a_failed_fabric_gpu_is_reported_by_name_with_its_class_effect_and_reason(
    tmp_path: Path,
) -> None:
    monitor = HealthMonitor()
    monitor.bind_loop()
    monitor.set_devices({"fabric": [ATTACHED, OTHER]})
    view = FabricNodeView("node-a", {}, tmp_path)
    assert gpu_failures(monitor, [ATTACHED, OTHER]) == {}
    stream = aiter(monitor.updates())
    await anext(stream)
    monitor.report_xid("GPU-fab", 79)  # fell off the bus: replace class
    await asyncio.wait_for(anext(stream), 2)  # the report hops onto the loop
    failed = gpu_failures(monitor, [ATTACHED, OTHER])
    report = view.report([ATTACHED, OTHER], {("gpu", "GPU-fab")}, None, failed)
    node = {"metadata": {"annotations": {NODE_ANNOTATION: report.to_annotation()}}}
    back = NodeFabric.from_node(node)
    assert back is not None and set(back.failed) == {"GPU-fab"}
    f = back.failed["GPU-fab"]
    assert (f.failure_class, f.effect, f.reason) == ("replace", "NoExecute", "xid-79")
    assert f.since.endswith("Z") and back.busy == {"GPU-fab"}
    # A healthy report says nothing of failures: the text older controllers read.
    assert "failed" not in view.report([OTHER]).to_annotation()
