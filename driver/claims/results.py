"""What a prepared claim amounts to: its spec's devices and edits, its answer.

Pure functions of the preparer (``driver.claims.preparer``): the claim spec
holds each device once, the claim-wide edits (control nodes, claim lists,
GPU sharing) merged without repeats, and the kubelet's answer is read back
from the claim's checkpoint record (the same answer after a restart).
"""

from __future__ import annotations

from driver.cdi import CdiDevice, ContainerEdits
from driver.checkpoint import ClaimRecord
from driver.claims.model import PreparedDevice, PrepareResult


def unique_devices(devices: list[CdiDevice]) -> list[CdiDevice]:
    seen: dict[str, CdiDevice] = {}
    for d in devices:
        seen.setdefault(d.name, d)
    return list(seen.values())


def merge_edits(edits: list[ContainerEdits]) -> ContainerEdits | None:
    if not edits:
        return None
    env = tuple(dict.fromkeys(e for x in edits for e in x.env))
    nodes = tuple(dict.fromkeys(n for x in edits for n in x.device_nodes))
    mounts = tuple(dict.fromkeys(m for x in edits for m in x.mounts))
    rw = tuple(dict.fromkeys(m for x in edits for m in x.writable_mounts))
    return ContainerEdits(env=env, device_nodes=nodes, mounts=mounts, writable_mounts=rw)


def result_of(record: ClaimRecord) -> PrepareResult:
    return PrepareResult(
        devices=tuple(
            PreparedDevice(
                request_names=tuple(d.request_names),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=d.share_id,
            )
            for d in record.devices
        )
    )
