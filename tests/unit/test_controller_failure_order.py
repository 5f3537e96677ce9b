"""A failed attach is written to the claim only once the pool without the
failed device is stored.

The scheduler clears an allocation whose ``FabricDeviceFailed`` is True and
schedules the pod again at once; had the pool with the failed device still
been stored, it could pick that device again (a second AttachFailed for one
failure, seen in a clean-clone run of the recovery e2e test). The API
double records, at the moment the failure is written, which fabric devices
the stored pool offers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from driver.controller.process.settings import ControllerSettings
from driver.controller.reconciler import Reconciler
from driver.errors import FabricApiError
from driver.fabric_devices.naming import FAILED_CONDITION, variant_name
from driver.fabricclient.memory import MemoryFabric
from driver.kube.api import RESOURCE_V1, slice_path
from driver.kube.memory import MemoryKube
from tests.unit.fabric_objects import GPU, node

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"
VARIANT = variant_name("GPU-0", "node-a", "adapter0", "gpu")


class OrderedKube(MemoryKube):
    """Records the stored pool's fabric devices whenever a claim status is written."""

    def __init__(self) -> None:
        super().__init__()
        self.pool_at_status: list[tuple[list[str], list[str]]] = []
        self.status_written = asyncio.Event()

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/status"):
            conds = [
                c["type"] for e in body["status"]["devices"] for c in e.get("conditions") or ()
            ]
            offered = sorted(
                d["attributes"]["fabricDevice"]["string"]
                for s in self.objects(slice_path())
                for d in s["spec"].get("devices") or ()
            )
            self.pool_at_status.append((conds, offered))
            self.status_written.set()
        return await super().merge_patch(path, body)


async def test_the_failure_is_written_after_the_pool_without_the_device() -> None:
    api, fabric = OrderedKube(), MemoryFabric([GPU])
    api.add("/api/v1/nodes", node({}))
    claim = {
        "metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "patchbay.dev", "pool": "fabric", "device": VARIANT}
        ]}}},
    }  # fmt: skip
    api.add(CLAIMS, claim)
    fabric.fail("attach", FabricApiError(400, "ActionNotSupported", "refused"))
    settings = ControllerSettings(
        fabric_url="http://fabric",
        fabric_token="t",
        fabric_refresh=300,
        fabric_insecure=True,
        fabric_pool_shape="per-node",  # the per-node variant's name
    )
    rec = Reconciler(api, fabric, settings)
    task = asyncio.create_task(rec.run())
    try:
        await asyncio.wait_for(api.status_written.wait(), 60)  # a hang guard only
        conds, offered = api.pool_at_status[0]
        assert conds == [FAILED_CONDITION]
        assert offered == []  # gpu-0's variant, the allocated one too, is gone
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
