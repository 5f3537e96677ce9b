"""What the plugin does about MIG once, at start: who owns which instance.

The checkpoint is the only record of which claim owns which placement. At
start we read it (before the claim preparer runs) to seed the full-GPU
guard (which then follows each re-read of a checkpoint another plugin
process wrote, ``driver.mig.guard``), and compare it with the instances
NVML reports on the GPUs we partition. Instances no record owns - left by
an operator, another tool, or a crash before PrepareStarted was written -
are reported, and destroyed only when ``--mig-orphan-cleanup`` is on.
Instances of records left in PrepareStarted are owned: the preparer undoes
them when the claim is prepared or unprepared again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from driver.checkpoint import Checkpoint
from driver.gpu.fraction import KIND as SHARED
from driver.holdings import holdings
from driver.mig.layout import KIND, parse_local_id
from driver.nvml.backend import GpuInfo, MigInstance, NvmlBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ownership:
    """Placements and whole GPUs the checkpointed claims hold."""

    placements: frozenset[tuple[str, int, int]] = frozenset()  # (GPU UUID, profile id, start)
    full_gpus: frozenset[str] = frozenset()
    sharers: Mapping[str, frozenset[str]] = field(default_factory=dict)  # GPU UUID -> claims


def ownership(checkpoint: Checkpoint) -> Ownership:
    """What the checkpoint's records hold of the GPUs (admin-access views hold nothing)."""
    placements: set[tuple[str, int, int]] = set()
    full: set[str] = set()
    shares: dict[str, set[str]] = {}
    for held in holdings(checkpoint, (KIND, "gpu", SHARED)):
        if held.kind == KIND:
            placements.add(parse_local_id(held.local_id))
        elif held.kind == "gpu":
            full.add(held.local_id)
        elif held.kind == SHARED:
            full.add(held.local_id)
            shares.setdefault(held.local_id, set()).add(held.claim_uid)
    return Ownership(
        frozenset(placements),
        frozenset(full),
        {uuid: frozenset(claims) for uuid, claims in shares.items()},
    )


@dataclass
class OrphanReport:
    found: list[tuple[str, MigInstance]] = field(default_factory=list)
    destroyed: int = 0


def orphans(
    nvml: NvmlBackend, gpus: Iterable[GpuInfo], owned: Ownership, cleanup: bool
) -> OrphanReport:
    """Report (and with ``cleanup``, destroy) instances no claim owns."""
    report = OrphanReport()
    for gpu in gpus:
        if not gpu.mig_mode_current:
            continue
        seen: set[int] = set()
        for inst in nvml.mig_instances(gpu.uuid):
            if inst.gi_id in seen or (gpu.uuid, inst.profile_id, inst.start) in owned.placements:
                continue
            seen.add(inst.gi_id)
            report.found.append((gpu.uuid, inst))
            log.warning(
                "MIG instance no claim owns on %s: GI %d, profile %d at %d (MIG %s)%s",
                gpu.uuid, inst.gi_id, inst.profile_id, inst.start, inst.mig_uuid,
                "; destroying it" if cleanup else "; left alone (--mig-orphan-cleanup is off)",
            )  # fmt: skip
            if cleanup:
                nvml.destroy_mig(gpu.uuid, inst.gi_id)
                report.destroyed += 1
    return report
