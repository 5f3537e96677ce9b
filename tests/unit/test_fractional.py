"""Fractional GPUs: the shared device we publish (capacities, policies, the
counters that keep one mode per GPU), HAMi-core's limits per visible index,
the preload mounts, and the preparer's rules for shares of one device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import Checkpoint, CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.kind import Discovery
from driver.devices.model import CounterConsumption, Device
from driver.errors import ClaimError, ConfigError
from driver.gpu.fraction import SharePolicy, shared_device, with_shared
from driver.gpu.hami import LIBRARY_IN_CONTAINER, PRELOAD_IN_CONTAINER, SharedGpuHandler, limits
from driver.gpu.kind import GpuType
from driver.gpu.prepare import GpuHandler
from driver.health.monitor import HealthMonitor
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from driver.slices.limits import device_problems
from tests.claims_doubles import NODE, Reader


def gpu(index: int, mib: int = 81920, counters: bool = False) -> Device:
    consumes = (CounterConsumption(f"gpu-{index}-mig", (("mem0", "1"),)),) if counters else ()
    return Device(
        name=f"gpu-{index}",
        kind="gpu",
        local_id=f"GPU-{index}",
        attributes={"index": index, "minor": index, "uuid": f"GPU-{index}"},
        capacity={"memory": f"{mib}Mi"},
        consumes_counters=consumes,
    )


def test_policy_selects_by_index_or_uuid_and_refuses_odd_settings() -> None:
    policy = SharePolicy.parse("1, GPU-3", 1024)
    assert [policy.selects(gpu(i)) for i in range(4)] == [False, True, False, True]
    assert SharePolicy.parse("all", 512).selects(gpu(7))
    assert not SharePolicy.parse("", 1024).enabled
    with pytest.raises(ConfigError, match="shared-gpus"):
        SharePolicy.parse("all,0", 1024)
    with pytest.raises(ConfigError, match="shared-gpu-memory-step"):
        SharePolicy.parse("all", 0)


def test_shared_device_json_is_what_the_apiserver_stores() -> None:
    dev = shared_device(gpu(0, 81559), 1024)
    assert dev is not None
    out = dev.to_json()
    assert out["allowMultipleAllocations"] is True
    assert out["capacity"] == {
        "cores": {"value": "100", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}},
        "memory": {"value": "81559Mi", "requestPolicy": {
            "default": "79Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
    }  # fmt: skip
    assert out["attributes"]["type"] == {"string": "shared-gpu"}
    assert Device.from_json(out, dev.local_id).to_json() == out, "read back the same"
    assert device_problems(dev) == []
    assert shared_device(gpu(0, 1500), 1024) is None, "under two steps"


def test_one_mode_per_gpu_counters() -> None:
    found = with_shared(
        Discovery(devices=(gpu(0), gpu(1, counters=True), gpu(2))), SharePolicy.parse("0,1", 1024)
    )
    names = [d.name for d in found.devices]
    assert names == ["gpu-0", "gpu-1", "gpu-2", "gpu-0-shared", "gpu-1-shared"]
    by_name = {d.name: d for d in found.devices}
    assert [s.name for s in found.counter_sets] == ["gpu-0-whole"]
    # The full GPU and its shared twin consume the same whole set.
    assert by_name["gpu-0"].consumes_counters == by_name["gpu-0-shared"].consumes_counters
    assert by_name["gpu-0"].consumes_counters[0].counter_set == "gpu-0-whole"
    assert by_name["gpu-1-shared"].consumes_counters == by_name["gpu-1"].consumes_counters
    assert by_name["gpu-2"].consumes_counters == (), "not shareable: untouched"


def test_limits_follow_what_the_share_consumed() -> None:
    assert limits({"memory": "20Gi", "cores": "25"}) == (
        ("CUDA_DEVICE_MEMORY_LIMIT", "20480m"),
        ("CUDA_DEVICE_SM_LIMIT", "25"),
    )
    assert limits({"memory": "81419Mi", "cores": "0"}) == (("CUDA_DEVICE_MEMORY_LIMIT", "81419m"),)


def claim(
    reader: Reader, name: str, shares: list[tuple[str, str | None, dict[str, str]]]
) -> ClaimRef:
    ref = reader.add(name, [d for d, _, _ in shares])
    results = reader.claims[("ns", name)]["status"]["allocation"]["devices"]["results"]
    for result, (_, share, consumed) in zip(results, shares, strict=True):
        if share is not None:
            result["shareID"] = share
            result["consumedCapacity"] = consumed
    return ref


@pytest.fixture
def env(tmp_path: Path) -> tuple[Reader, ClaimPreparer, Path]:
    gpus = [gpu(i) for i in range(2)]
    found = with_shared(Discovery(devices=tuple(gpus)), SharePolicy.parse("all", 1024))
    inv = NodeInventory()
    inv.replace_pool(NODE, list(found.devices))
    library = tmp_path / "libvgpu.so"
    handlers: dict[str, Any] = {
        "gpu": GpuHandler(tmp_path / "dev"),
        "shared-gpu": SharedGpuHandler(GpuHandler(tmp_path / "dev"), library, tmp_path / "state"),
    }
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    reader = Reader()
    prep = ClaimPreparer(reader, inv, handlers, store, CdiRegistry(tmp_path / "cdi"))
    return reader, prep, tmp_path


def spec_env(tmp: Path, uid: str) -> list[str]:
    spec = json.loads((tmp / "cdi" / f"k8s.patchbay.dev-claim_{uid}.json").read_text())
    return list(spec["containerEdits"]["env"])


async def test_two_shares_of_one_gpu_each_get_their_limits_and_share_id(
    env: tuple[Reader, ClaimPreparer, Path],
) -> None:
    reader, prep, tmp = env
    a = claim(reader, "a", [("gpu-0-shared", "s-a", {"memory": "20Gi", "cores": "25"})])
    b = claim(reader, "b", [("gpu-0-shared", "s-b", {"memory": "8Gi", "cores": "0"})])
    res = await prep.prepare([a, b])
    assert res[a.uid].error == res[b.uid].error == ""
    assert res[a.uid].devices[0].share_id == "s-a" and res[b.uid].devices[0].share_id == "s-b"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=20480m" in spec_env(tmp, a.uid)
    assert "CUDA_DEVICE_SM_LIMIT_0=25" in spec_env(tmp, a.uid)
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=8192m" in spec_env(tmp, b.uid)
    assert not any(e.startswith("CUDA_DEVICE_SM_LIMIT") for e in spec_env(tmp, b.uid))
    spec = json.loads((tmp / "cdi" / f"k8s.patchbay.dev-claim_{a.uid}.json").read_text())
    mounts = {
        m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]
    }
    assert mounts[LIBRARY_IN_CONTAINER] == str(tmp / "libvgpu.so")
    preload = Path(mounts[PRELOAD_IN_CONTAINER])
    assert preload.read_bytes() == f"{LIBRARY_IN_CONTAINER}\n".encode()  # noqa: ASYNC240
    # An exclusive claim of the same GPU is refused while sharers hold it...
    whole = claim(reader, "whole", [("gpu-0", None, {})])
    assert "already prepared for claim" in (await prep.prepare([whole]))[whole.uid].error
    await prep.unprepare([a, b])
    # ...and a share is refused while an exclusive claim holds it.
    assert (await prep.prepare([whole]))[whole.uid].error == ""
    c = claim(reader, "c", [("gpu-0-shared", "s-c", {"memory": "1Gi", "cores": "0"})])
    assert "already prepared for claim" in (await prep.prepare([c]))[c.uid].error


async def test_limits_are_numbered_by_the_gpu_the_container_sees(
    env: tuple[Reader, ClaimPreparer, Path],
) -> None:
    reader, prep, tmp = env
    two = claim(reader, "two", [
        ("gpu-1-shared", "s-1", {"memory": "4Gi", "cores": "10"}),
        ("gpu-0-shared", "s-0", {"memory": "2Gi", "cores": "20"}),
    ])  # fmt: skip
    assert (await prep.prepare([two]))[two.uid].error == ""
    env_ = spec_env(tmp, two.uid)
    assert "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-0" in env_
    assert {"CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=10"} <= set(env_)
    assert {"CUDA_DEVICE_MEMORY_LIMIT_1=2048m", "CUDA_DEVICE_SM_LIMIT_1=20"} <= set(env_)


def mig_node(checkpoint: Checkpoint) -> tuple[FakeMachine, GpuType]:
    machine = FakeMachine()
    machine.add_gpu("GPU-0000", "H100-SXM5-80GB", "0000:10:00.0")
    backend = FakeNvml(machine)
    support = MigSupport(
        NvmlSession(backend),
        MigPolicy.parse("all", "", True, False),
        lambda s, g: MigHandler(s, g, Path("/nonexistent")),
        lambda: checkpoint,
    )
    share = SharePolicy.parse("all", 1024)
    return machine, GpuType(backend, Path("/x"), Path("/x"), mig=support, share=share)


def share_record(uid: str) -> ClaimRecord:
    dev = DeviceRecord(request_names=["r"], pool_name="p", device_name="gpu-0-shared",
                       kind="shared-gpu", local_id="GPU-0000", undo={"claim": uid})  # fmt: skip
    return ClaimRecord(uid=uid, namespace="n", name=uid, state=ClaimState.PREPARE_COMPLETED,
                       devices=[dev])  # fmt: skip


def test_sharers_hold_a_mig_gpu_whole_until_the_last_leaves_across_a_restart() -> None:
    _, gpus = mig_node(Checkpoint())
    devices = {d.name: d for d in gpus.discover().devices}
    handlers = gpus.handlers()
    shared, mig = devices["gpu-0-shared"], devices["gpu-0-mig-1g-10gb-0"]
    assert shared.consumes_counters == devices["gpu-0"].consumes_counters
    for uid in ("a", "b"):
        handlers["shared-gpu"].prepare(shared, uid, None)
    with pytest.raises(ClaimError, match="held whole"):
        handlers["mig"].prepare(mig, "m", None)
    # A restart: the guard is seeded from the checkpoint's two shares.
    _, gpus = mig_node(Checkpoint(claims={u: share_record(u) for u in ("a", "b")}))
    gpus.discover()
    handlers = gpus.handlers()
    handlers["shared-gpu"].unprepare("shared-gpu", "GPU-0000", {"claim": "a"})
    with pytest.raises(ClaimError, match="held whole"):
        handlers["mig"].prepare(mig, "m", None)
    handlers["shared-gpu"].unprepare("shared-gpu", "GPU-0000", {"claim": "b"})
    handlers["mig"].prepare(mig, "m", None)


def test_a_critical_xid_taints_the_shared_twin_too() -> None:
    found = with_shared(Discovery(devices=(gpu(0), gpu(1))), SharePolicy.parse("all", 1024))
    monitor = HealthMonitor()
    monitor.set_devices({NODE: found.devices})
    monitor.report_xid("GPU-0", 79)
    tainted = {d.name for d in monitor.tainted(found.devices) if d.taints}
    assert tainted == {"gpu-0", "gpu-0-shared"}
