"""Which prepared devices have a utilization source (driver.idle.sources)."""

from __future__ import annotations

from typing import Any

from driver.checkpoint import Checkpoint, ClaimRecord, ClaimState, DeviceRecord
from driver.idle.sources import Held, Source, watched

UID = "6f1b1c9e-0000-4000-8000-000000000001"


def record(kind: str, local_id: str, device: str, **undo: Any) -> DeviceRecord:
    return DeviceRecord(request_names=["r"], pool_name="node-a", device_name=device,
                        kind=kind, local_id=local_id, undo=undo)  # fmt: skip


def checkpoint(state: ClaimState, *devices: DeviceRecord) -> Checkpoint:
    claim = ClaimRecord(uid=UID, namespace="ns", name="c", state=state, devices=list(devices))
    return Checkpoint(claims={UID: claim})


def held(device: str, share: str | None = None) -> Held:
    return Held(UID, "ns", "c", "node-a", device, share)


def test_gpus_mig_devices_and_shares_have_sources_the_rest_none() -> None:
    cp = checkpoint(
        ClaimState.PREPARE_COMPLETED,
        record("gpu", "GPU-a", "gpu-0"),
        record("gpu", "GPU-b", "gpu-1", shareID="s1"),
        record("shared-gpu", "GPU-c", "gpu-2-shared"),
        record("mig", "GPU-d:9:4", "gpu-3-mig-3g-4", giId=2, migUUID="MIG-x"),
        record("gpu", "GPU-e", "gpu-4", pci="0000:3b:00.0", driver="nvidia"),  # vfio
        record("vf", "0000:5e:00.2", "vf-0"),
        record("gpu", "GPU-f", "gpu-5", adminAccess=True),
    )
    assert watched(cp) == {
        held("gpu-0"): Source("GPU-a"),
        held("gpu-1", "s1"): Source("GPU-b"),
        held("gpu-2-shared"): Source("GPU-c"),
        held("gpu-3-mig-3g-4"): Source("GPU-d", 2),
    }


def test_a_claim_still_preparing_is_not_watched() -> None:
    cp = checkpoint(ClaimState.PREPARE_STARTED, record("gpu", "GPU-a", "gpu-0"))
    assert watched(cp) == {}


def test_a_share_is_read_by_its_claims_pods_a_whole_gpu_is_not() -> None:
    cp = checkpoint(
        ClaimState.PREPARE_COMPLETED,
        record("gpu", "GPU-a", "gpu-0"),
        record("gpu", "GPU-b", "gpu-1", shareID="s1"),
        record("shared-gpu", "GPU-c", "gpu-2-shared"),
    )
    cp.claims[UID].pods = ["pod-1", "pod-2"]
    pods = frozenset({"pod-1", "pod-2"})
    assert watched(cp) == {
        held("gpu-0"): Source("GPU-a"),
        held("gpu-1", "s1"): Source("GPU-b", pods=pods),
        held("gpu-2-shared"): Source("GPU-c", pods=pods),
    }
