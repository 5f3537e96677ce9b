"""NVMe drives of a fabric manager without a fabric: a PCIe expansion box.

Why a module: an expansion box's manager (DMTF's ``public-expansion-box``
mockup) lists its drives under ``Chassis/<c>/Drives`` and
``ResourceBlocks/<b>/Drives`` and has no Fabric, hence no endpoints and no
reachability. The client can still list them (kind, serial, model,
capacity) so an operator sees what the box holds; attaching them is the
fabric's business (the ``connections`` and ``zones`` dialects).
"""

from __future__ import annotations

import asyncio
from typing import Any

from driver.fabricclient import wire
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import FabricDevice

ROOT = "/redfish/v1"


async def _drive_links(links: Links, holder: dict[str, Any]) -> list[str]:
    """The drive URIs of a Chassis or ResourceBlock: its Drives link or list."""
    drives = holder.get("Drives")
    if isinstance(drives, list):
        return [d["@odata.id"] for d in drives if isinstance(d, dict) and "@odata.id" in d]
    if isinstance(drives, dict) and isinstance(drives.get("@odata.id"), str):
        return [m["@odata.id"] for m in await links.members(drives["@odata.id"])]
    return []


async def read_drives(links: Links) -> list[FabricDevice]:
    """Every NVMe drive under the Chassis and ResourceBlocks collections."""
    root = await links.get(ROOT)
    holders: list[dict[str, Any]] = []
    for name in ("Chassis", "ResourceBlocks"):
        ref = root.get(name)
        if isinstance(ref, dict) and isinstance(ref.get("@odata.id"), str):
            holders += await links.members(ref["@odata.id"])
    uris = sorted({u.rstrip("/") for h in holders for u in await _drive_links(links, h)})
    bodies = await asyncio.gather(*(links.get(u) for u in uris))
    out = []
    for uri, body in zip(uris, bodies, strict=True):
        d = parse(wire.Device, body, uri)
        if (d.protocol or "").lower() != "nvme":
            continue
        status = parse(wire.Status, body.get("Status") or {}, uri)
        out.append(FabricDevice(
            uri, "", "", "nvme", d.model or "", d.serial or "", "", 0, 0, status.health or "OK",
            status.state != "UnavailableOffline", False, (), None, "", d.capacity_bytes or 0,
            wire.durable(d.identifiers, "NQN"), uri,
        ))  # fmt: skip
    return out
