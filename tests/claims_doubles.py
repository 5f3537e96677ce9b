"""Doubles of the claim preparer's collaborators for unit tests: a claim
reader serving ResourceClaims from a dict, and GPU handlers that record the
"hardware" they set up (one that may fail, one that cannot be set up twice)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.claims.model import ClaimRef
from driver.config.opaque import DeviceConfig
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.errors import ApiError, DeviceError
from driver.gpu.prepare import GpuHandler

NODE = "node-a"


class Reader:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ApiError(f"resourceclaims {name} not found") from None

    def add(
        self,
        name: str,
        devices: Sequence[str] | Mapping[str, Sequence[str]],
        *,
        driver: str = "patchbay.dev",
        pool: str = NODE,
        config: list[dict[str, Any]] | None = None,
        namespace: str = "ns",
        uid: str | None = None,
    ) -> ClaimRef:
        """An allocated claim of ``devices``: a list (one request each,
        ``req-0``, ``req-1``...) or a mapping of request name to its devices."""
        uid = uid or str(uuid.uuid4())
        requests = (
            devices
            if isinstance(devices, Mapping)
            else {f"req-{i}": [d] for i, d in enumerate(devices)}
        )
        results = [
            {"request": r, "driver": driver, "pool": pool, "device": d}
            for r, names in requests.items()
            for d in names
        ]
        self.claims[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
        }
        return ClaimRef(namespace, name, uid)


class FlakyHandler(GpuHandler):
    """A GPU handler that records side effects and can fail on a device."""

    def __init__(self, dev_root: Path) -> None:
        super().__init__(dev_root)
        self.active: set[str] = set()
        self.fail_on: str | None = None

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        self.active.add(device.local_id)
        if device.name == self.fail_on:
            raise DeviceError(f"{device.name} broke")
        return super().prepare(device, claim_uid, config)

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        self.active.discard(local_id)


class OnceHandler(FlakyHandler):
    """Hardware that cannot be set up twice (like a MIG placement or a driver
    binding): a prepare is refused while the device is still set up, and
    every call is logged. ``active`` is the hardware, which outlives a crash."""

    has_side_effects = True

    def __init__(self, dev_root: Path) -> None:
        super().__init__(dev_root)
        self.calls: list[tuple[str, str]] = []

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        if device.local_id in self.active:
            raise DeviceError(f"{device.local_id} is still set up")
        self.calls.append(("prepare", device.local_id))
        return super().prepare(device, claim_uid, config)

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        self.calls.append(("unprepare", local_id))
        super().unprepare(kind, local_id, undo)
