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
from driver.devices.handler import Preparation


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


class ClaimEdits:
    """A claim's CDI devices and claim-wide edits, gathered device by device.

    Claim-wide lists (``NVIDIA_VISIBLE_DEVICES``) are set once, in the spec's
    own edits: per device, the last device's value would win. Indexed
    variables are numbered by the device's place in the claim's first list."""

    def __init__(self) -> None:
        self.devices: list[CdiDevice] = []
        self._common: list[ContainerEdits] = []
        self._lists: dict[str, list[str]] = {}
        self._indexed: list[tuple[tuple[str, str], str, str]] = []  # (list item, var, value)

    def add(self, name: str, prep: Preparation, shared: ContainerEdits | None) -> None:
        """Device ``name`` prepared as ``prep``; ``shared``: its type's common edits."""
        self.devices.append(CdiDevice(name=name, edits=prep.edits))
        for var, item in prep.claim_lists:
            self._lists.setdefault(var, []).append(item)
        if prep.claim_lists:
            self._indexed += [(prep.claim_lists[0], k, v) for k, v in prep.indexed_env]
        self.add_common(shared)

    def add_common(self, edits: ContainerEdits | None) -> None:
        if edits is not None and edits not in self._common:
            self._common.append(edits)

    def merged(self) -> ContainerEdits | None:
        """The spec's own edits: the common ones and the claim-wide variables."""
        lists = self._lists
        env = tuple(f"{k}={','.join(dict.fromkeys(v))}" for k, v in lists.items())
        order = {k: list(dict.fromkeys(v)) for k, v in lists.items()}
        env += tuple(f"{k}_{order[item[0]].index(item[1])}={v}" for item, k, v in self._indexed)
        return merge_edits(self._common + ([ContainerEdits(env=env)] if env else []))
