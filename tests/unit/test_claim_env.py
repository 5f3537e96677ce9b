"""What a container sees of a claim's GPUs: ``NVIDIA_VISIBLE_DEVICES`` lists
every GPU (or MIG device) of the claim, under the CDI semantics containerd
and CRI-O apply (the upstream library's ``Cache.InjectDevices``): the
container gets the union of its CDI devices' edits, each spec's own edits
with its first device, and a later variable overrides an earlier one by name.
A 2-GPU claim used to show only its last GPU."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from driver.cdi import CdiRegistry
from driver.checkpoint import Checkpoint, CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.devices.handler import DeviceHandler
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.gpu.kind import GpuType
from driver.gpu.prepare import GpuHandler
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine
from tests.claims_doubles import NODE, Reader


def container_env(cdi_root: Path, ids: list[str]) -> dict[str, str]:
    """The env a runtime builds from ``ids`` (the CDI library's injection)."""
    specs = [json.loads(p.read_text()) for p in sorted(cdi_root.glob("*.json"))]
    devices = {
        f"{s['kind']}={d['name']}": (i, d.get("containerEdits") or {})
        for i, s in enumerate(specs)
        for d in s["devices"]
    }
    edits: list[Mapping[str, Any]] = []
    seen: set[int] = set()
    for cdi_id in ids:
        spec_index, device_edits = devices[cdi_id]  # unresolvable: KeyError
        if spec_index not in seen:
            seen.add(spec_index)
            edits.append(specs[spec_index].get("containerEdits") or {})
        edits.append(device_edits)
    env: dict[str, str] = {}
    for e in edits:
        for entry in e.get("env") or ():
            name, _, value = entry.partition("=")
            env[name] = value
    return env


def ids_of(result: Any, request: str | None = None) -> list[str]:
    """The kubelet's CDI IDs for a container that names the claim (and maybe
    one of its requests)."""
    return [
        i
        for d in result.devices
        if request is None or request in d.request_names
        for i in d.cdi_device_ids
    ]


def preparer(tmp_path: Path, devices: list[Device], handlers: Mapping[str, DeviceHandler]) -> Any:
    inv = NodeInventory()
    inv.replace_pool(NODE, devices)
    reader = Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    prep = ClaimPreparer(reader, inv, handlers, store, CdiRegistry(tmp_path / "cdi"))
    return reader, prep


async def test_two_gpu_claim_sees_both_gpus_and_two_claims_see_one_claim(tmp_path: Path) -> None:
    gpus = [Device(f"gpu-{i}", "gpu", f"GPU-{i}", {"minor": i}) for i in range(4)]
    reader, prep = preparer(tmp_path, gpus, {"gpu": GpuHandler(tmp_path / "dev")})
    pair = reader.add("pair", {"gpu": ["gpu-0", "gpu-1"]})
    split = reader.add("split", {"a": ["gpu-2"], "b": ["gpu-3"]})
    results = await prep.prepare([pair, split])
    assert all(r.error == "" for r in results.values())
    cdi = tmp_path / "cdi"
    env = container_env(cdi, ids_of(results[pair.uid]))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    # A claim with two requests: the list is the claim's, whichever request a
    # container names (the claim's spec edits come with any of its devices).
    assert container_env(cdi, ids_of(results[split.uid]))["NVIDIA_VISIBLE_DEVICES"] == (
        "GPU-2,GPU-3"
    )
    assert container_env(cdi, ids_of(results[split.uid], "a"))["NVIDIA_VISIBLE_DEVICES"] == (
        "GPU-2,GPU-3"
    )
    # Two claims in one container: no edit merges a variable across claims; the
    # claim whose devices come last wins (docs/design.md).
    both = ids_of(results[pair.uid]) + ids_of(results[split.uid])
    assert container_env(cdi, both)["NVIDIA_VISIBLE_DEVICES"] == "GPU-2,GPU-3"


async def test_mig_claim_lists_every_mig_device(tmp_path: Path) -> None:
    machine = FakeMachine()
    machine.add_gpu("GPU-0000", "H100-SXM5-80GB", "0000:10:00.0")
    backend = FakeNvml(machine)
    support = MigSupport(
        NvmlSession(backend),
        MigPolicy.parse("all", "", True, False),
        lambda s, g: MigHandler(s, g, tmp_path / "dev"),
        Checkpoint,
    )
    gpu_type = GpuType(backend, tmp_path / "sys", tmp_path / "dev", mig=support)
    devices = list(gpu_type.discover().devices)
    reader, prep = preparer(tmp_path, devices, gpu_type.handlers())
    claim = reader.add("migs", {"mig": ["gpu-0-mig-3g-40gb-0", "gpu-0-mig-1g-10gb-4"]})
    result = (await prep.prepare([claim]))[claim.uid]
    assert result.error == ""
    mig_uuids = [u for gi in machine.gpus["GPU-0000"].instances.values() for u in gi.cis.values()]
    visible = container_env(tmp_path / "cdi", ids_of(result))["NVIDIA_VISIBLE_DEVICES"]
    assert len(mig_uuids) == 2 and sorted(visible.split(",")) == sorted(mig_uuids)
    assert all(u.startswith("MIG-") for u in mig_uuids)
