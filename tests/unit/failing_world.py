"""A controller's world whose node-a plugin can find an attached fabric GPU
failed and hold it prepared (issue 38, the fabric path).

Shared by the fabric failure tests (test_controller_fabric_failures) and the
replacement tests (test_controller_replacements); on the shipped in-memory
API and fabric (tests/unit/controller_world.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from driver.controller.reconciler import Reconciler
from driver.fabric_devices.naming import NODE_ANNOTATION, DeviceFailure, NodeFabric
from tests.unit.controller_world import World
from tests.unit.domain_claims import NAME

FAILURE = DeviceFailure("replace", "NoExecute", "xid-79", "2026-12-03T10:00:00Z")
KEY = "patchbay.dev/unhealthy"


class Failing(World):
    """node-a's plugin, which can find an attached GPU failed and hold it prepared."""

    def __init__(self, gpus: int = 2) -> None:
        super().__init__(gpus)
        self.failed: dict[str, DeviceFailure] = {}
        self.busy: set[str] = set()

    async def report(self) -> None:
        seen = {
            d.uuid: d.connection.adapter
            for d in self.fabric.devices.values()
            if d.connection is not None and d.connection.state == "Attached"
        }
        failed = {u: f for u, f in self.failed.items() if u in seen}
        report = NodeFabric({"adapter0": "pci0000:15"}, gpus=seen, failed=failed,
                            busy=frozenset(self.busy & set(seen)))  # fmt: skip
        ann = {NODE_ANNOTATION: report.to_annotation()}
        await self.api.merge_patch("/api/v1/nodes/node-a", {"metadata": {"annotations": ann}})

    def taints(self, name: str = NAME) -> list[dict[str, Any]]:
        return list(self.devices().get(name, {}).get("taints") or ())

    def health(self, rec: Reconciler, value: Literal["OK", "Warning", "Critical"]) -> None:
        d = self.fabric.devices["gpu-0"]
        self.fabric.devices["gpu-0"] = dataclasses.replace(d, health=value)
        rec.refresh_fabric()
