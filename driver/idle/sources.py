"""Which prepared devices have a utilization source, and which one.

Why: NVML measures a whole GPU (``nvmlDeviceGetUtilizationRates``) and a
MIG device's GPU instance (GPM); nothing else patchbay prepares has a
source. From the checkpoint's records (``driver.checkpoint``):

- ``gpu``: the GPU, by UUID; not one handed to a VM (vfio-pci: NVML no
  longer sees it, ``driver.gpu.passthrough``);
- ``mig``: its GPU instance (the ``giId`` the prepare recorded) on its GPU;
- ``shared-gpu`` and a share of a ``gpu`` (consumable capacity): the
  processes of its claim's pods (``nvmlDeviceGetProcessUtilization``,
  mapped by ``driver.idle.shares``), so one busy share no longer keeps the
  others of its GPU from being idle. Where the pods are not known (a record
  of an older version, a claim reserved for a PodGroup) the whole GPU's
  utilization, as before: a share is then idle only when the whole GPU is;
- a ``gpu`` one claim holds (time slicing or MPS among its own pods
  included): the whole GPU's utilization;
- VFs, NVMe drives, CXL memory, admin-access views: none (never idle).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from driver.checkpoint import Checkpoint, ClaimState, DeviceRecord
from driver.gpu.fraction import KIND as SHARED_GPU
from driver.gpu.passthrough import PCI
from driver.mig.layout import KIND as MIG
from driver.mig.layout import parse_local_id


@dataclass(frozen=True)
class Source:
    """A whole GPU (``gi_id`` None), one of its MIG GPU instances, or the
    processes of ``pods`` on it (one claim's share)."""

    gpu: str  # UUID
    gi_id: int | None = None
    pods: frozenset[str] | None = None  # pod UIDs: a share read per process


@dataclass(frozen=True)
class Held:
    """A device a prepared claim holds: its claim and its ``status.devices`` key."""

    claim_uid: str
    namespace: str
    claim: str
    pool: str
    device: str
    share_id: str | None


def source_of(record: DeviceRecord, pods: Collection[str] | None = None) -> Source | None:
    """The device's utilization source, None when it has none; ``pods``: the
    UIDs of its claim's pods (None: not known)."""
    if record.admin_access:
        return None
    if record.kind == SHARED_GPU or (record.kind == "gpu" and record.share_id is not None):
        return Source(record.local_id, pods=frozenset(pods) if pods is not None else None)
    if record.kind == "gpu":
        return None if isinstance(record.undo.get(PCI), str) else Source(record.local_id)
    if record.kind == MIG and isinstance(record.undo.get("giId"), int):
        return Source(parse_local_id(record.local_id)[0], int(record.undo["giId"]))
    return None


def watched(checkpoint: Checkpoint) -> dict[Held, Source]:
    """Every device of a prepared claim that has a utilization source."""
    out: dict[Held, Source] = {}
    for claim in checkpoint.claims.values():
        if claim.state is not ClaimState.PREPARE_COMPLETED:
            continue
        for d in claim.devices:
            source = source_of(d, claim.pods)
            if source is not None:
                held = Held(claim.uid, claim.namespace, claim.name, d.pool_name,
                            d.device_name, d.share_id)  # fmt: skip
                out[held] = source
    return out
