"""A claim allocated a device published once, and a world that counts attach requests.

Shared by the per-domain attach tests (test_controller_domain_attach) and the
pairing tests (test_controller_adapter_pools); on the shipped in-memory API
and fabric (tests/unit/controller_world.py).
"""

from __future__ import annotations

from typing import Any

from driver.fabric_devices.naming import FAILED_CONDITION, READY_CONDITION, device_name
from driver.kube.api import RESOURCE_V1
from tests.unit.controller_world import World

CLAIMS = f"{RESOURCE_V1}/namespaces/default/resourceclaims"
POOL = "fabric/pcie0.sw0"
NAME = device_name("GPU-0")
ADAPTERS = {"fabric/adapters/node-a": ["adapter-adapter0"]}  # node-a's adapter pool (pairings)


def claim(node: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": "patchbay.dev", "pool": POOL, "device": NAME,
              "bindingConditions": [READY_CONDITION],
              "bindingFailureConditions": [FAILED_CONDITION]}  # fmt: skip
    selector = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip
    return {
        "metadata": {"name": "claim", "namespace": "default", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": selector}},
    }


def entry(w: World) -> dict[str, Any]:
    (stored,) = w.api.objects(CLAIMS)
    found: dict[str, Any] = next(iter(stored.get("status", {}).get("devices") or ()), {})
    return found


def condition(w: World, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in entry(w).get("conditions", ()))


class Counting(World):
    def __init__(self, gpus: int = 1) -> None:
        super().__init__(gpus)
        self.asked: list[tuple[str, str, str]] = []
        attach = self.fabric.attach

        async def counted(device_id: str, node: str, adapter: str, key: str = "") -> Any:
            self.asked.append((device_id, node, adapter))
            return await attach(device_id, node, adapter, key)

        self.fabric.attach = counted  # type: ignore[method-assign]
