"""Two logical devices of one CXL MLD in a controller's world, for unit tests.

Why: the LD tests (claims: test_controller_cxl_lds; spares and a count
manager's slots: test_controller_cxl_ld_spares) drive the real reconciler
over the same fabric and node plugin; it lives here once. The node reports
attached CXL memory by serial (:class:`Lds`, an older plugin) or by memdev
(:class:`Memdevs`, as the plugin does now).
"""

from __future__ import annotations

from typing import Any

from driver.fabric_devices.naming import (
    NODE_ANNOTATION,
    READY_CONDITION,
    NodeFabric,
    cxl_key,
)
from driver.fabricclient.model import FabricDevice
from tests.unit.controller_world import ADAPTER
from tests.unit.domain_claims import CLAIMS, Counting, claim

SERIAL = "0x4c1d96fffe000001"
ROOTS = {"adapter0": "pci0000:15"}


def ld(n: int, logical: str) -> FabricDevice:
    """LD ``n`` of the MLD (``logical``: its LD id as the client reads it, "" before)."""
    return FabricDevice(
        f"ld-{n}", "pcie0", "sw0", "cxlmem", "CZ120", SERIAL, "", 0x144D, 0xA820,
        "OK", True, False, (ADAPTER,), None, capacity_bytes=16 << 30, logical_device=logical,
    )  # fmt: skip


class Lds(Counting):
    """The MLD's LDs in the fabric; the node reports attached CXL memory by serial."""

    def __init__(self, *lds: FabricDevice) -> None:
        super().__init__(0)
        self.fabric.devices.update({d.id: d for d in lds})

    async def report(self) -> None:
        seen = {
            d.serial: d.connection.adapter
            for d in self.fabric.devices.values()
            if d.connection is not None and d.connection.state == "Attached"
        }
        ann = {NODE_ANNOTATION: NodeFabric(ROOTS, cxlmem=seen).to_annotation()}
        await self.api.merge_patch("/api/v1/nodes/node-a", {"metadata": {"annotations": ann}})


class Memdevs(Lds):
    """The node reports each attached LD by its memdev (``<serial>@<BDF>``), as
    the plugin does now; each LD gets the next BDF behind the adapter as it arrives."""

    def __init__(self, *lds: FabricDevice) -> None:
        super().__init__(*lds)
        self.bdfs: dict[str, str] = {}
        self.prepared: set[str] = set()  # the LDs a claim holds prepared on the node

    def busy(self) -> frozenset[str]:
        """By memdev, and by the serial too (as the plugin reports it)."""
        keys = {cxl_key(SERIAL, self.bdfs[d]) for d in self.prepared}
        return frozenset(keys | ({SERIAL} if keys else set()))

    async def report(self) -> None:
        seen = {}
        for d in sorted(self.fabric.devices.values(), key=lambda d: d.id):
            if d.connection is not None and d.connection.state == "Attached":
                bdf = self.bdfs.setdefault(d.id, f"0000:16:00.{len(self.bdfs)}")
                seen[cxl_key(SERIAL, bdf)] = d.connection.adapter
        report = NodeFabric(ROOTS, cxlmem=seen, busy=self.busy())
        ann = {NODE_ANNOTATION: report.to_annotation()}
        await self.api.merge_patch("/api/v1/nodes/node-a", {"metadata": {"annotations": ann}})


def allocated(pool: str, name: str, n: int = 1) -> dict[str, Any]:
    out = claim("node-a")
    out["metadata"] |= {"name": f"claim-{n}", "uid": f"uid-{n}"} if n > 1 else {}
    out["status"]["allocation"]["devices"]["results"][0] |= {"pool": pool, "device": name}
    return out


def data_of(w: Lds, name: str) -> dict[str, Any]:
    """The status data of claim ``name``'s device ({} before it is written)."""
    stored = {c["metadata"]["name"]: c for c in w.api.objects(CLAIMS)}
    entries = stored[name].get("status", {}).get("devices") or [{}]
    ready = any(c["type"] == READY_CONDITION for c in entries[0].get("conditions", ()))
    return dict(entries[0].get("data") or {}) if ready else {}
