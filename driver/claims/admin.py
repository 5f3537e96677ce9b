"""Admin access (``DRAAdminAccess``): a read-only view of a device.

Why this module exists: a claim whose request has ``adminAccess: true`` (only
allowed in a namespace labelled ``resource.kubernetes.io/admin-access:
"true"``) is allocated a device whether or not another claim holds it, for
monitoring. Preparing it must neither fail with the preparer's "already
prepared for claim" conflict nor change the device: no MIG instance is
created or destroyed, no driver is rebound, no whole-GPU guard is taken.
Each handler that supports it has ``prepare_admin``, which returns CDI edits
only (the device's identity: UUID, device node, PCI address); the device
record carries ``adminAccess`` in its undo data, so the claim holds nothing
(other claims' conflict check skips it) and its unprepare calls no handler.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from driver.checkpoint import Checkpoint, DeviceRecord
from driver.config.opaque import DeviceConfig
from driver.devices.handler import DeviceHandler, Preparation
from driver.devices.model import Device
from driver.errors import ClaimError

log = logging.getLogger(__name__)


class AdminView(Protocol):
    """A handler that can show a device read-only."""

    def prepare_admin(self, device: Device, holder: Mapping[str, Any] | None) -> Preparation:
        """CDI edits for ``device`` without touching it; ``holder`` is the undo
        data of the claim that holds it now (None when no claim does)."""
        ...


def is_admin(record: DeviceRecord) -> bool:
    return record.admin_access


def holder_undo(checkpoint: Checkpoint, device: Device, claim_uid: str) -> Mapping[str, Any] | None:
    """The undo data of the (non-admin) claim that holds ``device`` now."""
    for claim in list(checkpoint.claims.values()):  # a copy: other claims' threads add
        if claim.uid == claim_uid:
            continue
        for d in claim.devices:
            if d.kind == device.kind and d.local_id == device.local_id and not is_admin(d):
                return d.undo
    return None


def prepare(
    handler: DeviceHandler,
    device: Device,
    config: DeviceConfig | None,
    record: DeviceRecord,
    checkpoint: Checkpoint,
    claim_uid: str,
) -> Preparation:
    """The handler's ``prepare``, or its read-only ``prepare_admin`` when
    ``record`` is an admin-access view."""
    if not is_admin(record):
        return handler.prepare(device, claim_uid, config)
    view = getattr(handler, "prepare_admin", None)
    if view is None:
        raise ClaimError(f"device {device.name}: type {device.kind} has no admin-access view")
    holder = holder_undo(checkpoint, device, claim_uid)
    log.info(
        "claim %s: admin access to %s (%s), held by another claim: %s",
        claim_uid, device.name, device.local_id, holder is not None,
    )  # fmt: skip
    preparation: Preparation = view(device, holder)
    return preparation
