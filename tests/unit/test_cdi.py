"""CDI specs: one file per claim, valid IDs, UUID-checked file names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.cdi import CdiDevice, CdiRegistry, ContainerEdits, DeviceNode
from driver.devices.model import Device
from driver.errors import CdiError
from driver.gpu.prepare import GpuHandler

UID = "8f0c3a52-2b1e-4a53-9f3c-0d6f5b2f9a10"


def test_spec_content_and_ids(tmp_path: Path) -> None:
    reg = CdiRegistry(tmp_path)
    edits = ContainerEdits(
        env=("NVIDIA_VISIBLE_DEVICES=GPU-1",), device_nodes=(DeviceNode("/dev/nvidia1", 195, 1),)
    )
    ids = reg.write_claim_spec(
        UID.upper(), [CdiDevice("gpu-1", edits)], ContainerEdits(env=("A=1",))
    )
    assert ids == [f"k8s.patchbay.dev/claim={UID}-gpu-1"]
    spec = json.loads(reg.spec_path(UID).read_text())
    assert spec["kind"] == "k8s.patchbay.dev/claim"
    assert spec["devices"][0]["name"] == f"{UID}-gpu-1"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}
    ]
    assert spec["containerEdits"] == {"env": ["A=1"]}
    assert reg.claim_uids() == {UID}
    assert reg.remove_claim_spec(UID) is True
    assert reg.remove_claim_spec(UID) is False
    assert reg.claim_uids() == set()


@pytest.mark.parametrize("bad", ["../../etc/passwd", "abc", "", "8f0c3a52/../x"])
def test_claim_uid_must_be_uuid(tmp_path: Path, bad: str) -> None:
    with pytest.raises(CdiError, match="not a UUID"):
        CdiRegistry(tmp_path).write_claim_spec(bad, [CdiDevice("gpu-0")])
    assert list(tmp_path.iterdir()) == []


def test_gpu_handler_edits(tmp_path: Path) -> None:
    handler = GpuHandler(dev_root=tmp_path)  # no device nodes there: fixed major 195
    dev = Device(name="gpu-2", kind="gpu", local_id="GPU-abc", attributes={"minor": 2})
    prep = handler.prepare(dev, UID, None)
    assert prep.edits.env == ()  # the claim's spec lists every GPU (see test_claim_env)
    assert prep.claim_lists == (("NVIDIA_VISIBLE_DEVICES", "GPU-abc"),)
    assert prep.edits.device_nodes == (DeviceNode("/dev/nvidia2", 195, 2),)
    common = handler.common_edits()
    assert common is not None
    assert [n.path for n in common.device_nodes] == ["/dev/nvidiactl"]


def test_debris_removal_touches_only_our_files(tmp_path: Path) -> None:
    reg = CdiRegistry(tmp_path)
    reg.write_claim_spec(UID, [CdiDevice("gpu-0")])
    reg.remove_claim_spec(UID)  # leaves the spare
    (tmp_path / f".k8s.patchbay.dev-claim_{UID}.json.tmp-77").write_text("half")
    (tmp_path / ".nvidia.com-gpu.json.tmp-5").write_text("another writer's")
    (tmp_path / "nvidia.yaml").write_text("kind: nvidia.com/gpu")
    assert reg.remove_debris() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".nvidia.com-gpu.json.tmp-5",
        "nvidia.yaml",
    ]
