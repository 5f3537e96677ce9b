"""Device metadata files (KEP-5304): the stream decoded with the upstream
types' field names and versions, the files and their CDI mounts as the
preparer writes and removes them, and start-up removing what a crash left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.metadata import (
    POD_CLAIM_NAME_ANNOTATION,
    ClaimIdentity,
    MetadataDevice,
    go_json,
    read_stream,
    stream,
)
from driver.claims.metadata_files import MetadataFiles
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import PCI_BUS_ID, AttributeValue, Device, Version
from driver.errors import ClaimError
from driver.vf.config import PfPoolConfig
from driver.vf.discovery import scan_vfs
from driver.vf.prepare import VfHandler
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.claims_doubles import NODE, FlakyHandler, Reader

UID = "0b6e4c1e-3a8f-4d59-9a51-5c0f5b1d2e77"
BDF = "0000:17:00.0"


def gpu(name: str = "gpu-0") -> Device:
    attrs: dict[str, AttributeValue] = {
        "uuid": "GPU-0",
        "minor": 0,
        PCI_BUS_ID: BDF,
        "driverVersion": Version("580.1.0"),
    }
    return Device(name=name, kind="gpu", local_id="GPU-0", attributes=attrs)


def test_a_device_is_described_once_and_a_replaced_one_anew() -> None:
    device = gpu()
    first = MetadataDevice.of(NODE, device)
    assert MetadataDevice.of(NODE, device) is first, "the same device: made once"
    assert MetadataDevice.of("another-pool", device).pool == "another-pool"
    # Discovery replaces a device whose attributes changed: a new value.
    replaced = Device(name="gpu-0", kind="gpu", local_id="GPU-0", attributes={"minor": 1})
    again = MetadataDevice.of(NODE, replaced)
    assert again is not first and again.attributes["minor"] == {"int": 1}
    claim = ClaimIdentity("ns", "c", UID)
    assert [d["requests"][0]["devices"][0]["attributes"]["minor"] for d in read_stream(
        stream(claim, "gpu", [first]) + stream(claim, "gpu", [again])
    )] == [{"int": 0}] * 2 + [{"int": 1}] * 2  # fmt: skip
    net = {"interfaceName": "eth1"}
    assert MetadataDevice.of(NODE, device, net).network_data == net, "network data: not cached"


def test_stream_has_upstream_fields_and_versions_newest_first() -> None:
    claim = ClaimIdentity("ns", "pod-gpu-abc12", UID, pod_claim_name="gpu")
    net = {"interfaceName": "eth1", "hardwareAddress": "02:00:00:00:00:01"}
    devices = [MetadataDevice.of(NODE, gpu()), MetadataDevice.of(NODE, gpu("gpu-1"), net)]
    docs = read_stream(stream(claim, "req/large", devices))
    assert [d["apiVersion"] for d in docs] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    for doc in docs:
        assert doc["kind"] == "DeviceMetadata"
        assert doc["metadata"] == {
            "name": "pod-gpu-abc12",
            "namespace": "ns",
            "uid": UID,
            "generation": 1,
        }
        assert doc["podClaimName"] == "gpu"
        (request,) = doc["requests"]
        assert request["name"] == "req/large"  # as allocated: the subrequest too
        first, second = request["devices"]
        assert {k: first[k] for k in ("driver", "pool", "name")} == {
            "driver": "patchbay.dev",
            "pool": NODE,
            "name": "gpu-0",
        }
        assert first["attributes"][PCI_BUS_ID] == {"string": BDF}
        assert first["attributes"]["driverVersion"] == {"version": "580.1.0"}
        assert first["attributes"]["minor"] == {"int": 0}
        assert first["attributes"]["type"] == {"string": "gpu"}  # as the slice publishes it
        assert "networkData" not in first
        assert second["networkData"] == net
    assert docs[0] | {"apiVersion": ""} == docs[1] | {"apiVersion": ""}


def test_claim_without_template_has_no_pod_claim_name() -> None:
    claim = ClaimIdentity.of({"metadata": {"namespace": "ns", "name": "c"}}, UID)
    (doc, _) = read_stream(stream(claim, "req", []))
    assert "podClaimName" not in doc and doc["requests"] == [{"name": "req"}]


def test_go_escaping() -> None:
    assert go_json({"a": "<b>&\u2028é"}) == '{\n  "a": "\\u003cb\\u003e\\u0026\\u2028é"\n}'


@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, 2.5, True, False, None], "b": {}, "c": [], "d": {"e": [{"f": "g"}, []]}},
        {'k"q\\': "tab\tnew\nline\u0001é", "big": 2**70, "neg": -3, "exp": 1e-7},
        [["nested", ["deeper", {"x": ()}]], ("tuple", 0)],
        "just a string",
        7,
        {3: "int key", None: "null key", 2.5: "float key", True: "bool key"},
        {"nan": float("nan"), "inf": float("-inf")},
    ],
)
def test_go_json_indents_as_json_dumps_does(value: object) -> None:
    # The fast indenter (scalars through the C encoder) writes what the
    # pure-Python indenting encoder would, Go's escapes applied to both.
    slow = json.dumps(value, indent=2, ensure_ascii=False)
    assert go_json(value) == slow


def test_bad_pod_claim_name_is_refused_naming_the_field() -> None:
    meta = {"namespace": "ns", "name": "c", "annotations": {POD_CLAIM_NAME_ANNOTATION: "../x"}}
    with pytest.raises(
        ClaimError, match=r"metadata.annotations\[resource.kubernetes.io/pod-claim-name\]"
    ):
        ClaimIdentity.of({"metadata": meta}, UID)


@pytest.fixture
def env(tmp_path: Path) -> tuple[Reader, ClaimPreparer, Path]:
    inv = NodeInventory()
    inv.replace_pool(NODE, [gpu(f"gpu-{i}") for i in range(3)])
    reader = Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    files = MetadataFiles.in_plugin_dir(tmp_path / "plugin")
    handlers = {"gpu": FlakyHandler(tmp_path / "dev")}
    prep = ClaimPreparer(
        reader, inv, handlers, store, CdiRegistry(tmp_path / "cdi"), metadata=files
    )
    return reader, prep, tmp_path


async def test_prepare_writes_files_mounted_by_the_first_device_of_each_request(
    env: tuple[Reader, ClaimPreparer, Path],
) -> None:
    reader, prep, tmp = env
    ref = reader.add("c1", ["gpu-0", "gpu-1", "gpu-2"])
    results = reader.claims[("ns", "c1")]["status"]["allocation"]["devices"]["results"]
    results[1]["request"] = "req-0"  # gpu-0 and gpu-1 for req-0, gpu-2 for req-2
    reader.claims[("ns", "c1")]["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpus"}
    res = (await prep.prepare([ref]))[ref.uid]
    assert res.error == ""
    ids = {d.device_name: d.cdi_device_ids for d in res.devices}
    claim_id = f"k8s.patchbay.dev/claim={ref.uid}"
    assert ids == {
        "gpu-0": (f"{claim_id}-gpu-0", f"{claim_id}-metadata_req-0"),
        "gpu-1": (f"{claim_id}-gpu-1",),
        "gpu-2": (f"{claim_id}-gpu-2", f"{claim_id}-metadata_req-2"),
    }
    spec = json.loads((tmp / "cdi" / f"k8s.patchbay.dev-claim_{ref.uid}.json").read_text())
    mounts = {
        d["name"]: d["containerEdits"]["mounts"]
        for d in spec["devices"]
        if "metadata_" in d["name"]
    }
    host = tmp / "plugin" / "dra-device-metadata" / f"{ref.uid}_req-0.json"
    assert mounts[f"{ref.uid}-metadata_req-0"] == [
        {
            "hostPath": str(host),
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates"
            "/gpus/req-0/patchbay.dev-metadata.json",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]
    (doc, _) = read_stream(host.read_bytes())
    assert [d["name"] for d in doc["requests"][0]["devices"]] == ["gpu-0", "gpu-1"]
    assert doc["podClaimName"] == "gpus" and doc["metadata"]["name"] == "c1"
    assert (await prep.unprepare([ref]))[ref.uid] == ""
    assert list((tmp / "plugin" / "dra-device-metadata").glob("*.json")) == []


async def test_recover_removes_files_of_claims_without_a_record(
    env: tuple[Reader, ClaimPreparer, Path],
) -> None:
    reader, prep, tmp = env
    kept = reader.add("kept", ["gpu-0"])
    assert (await prep.prepare([kept]))[kept.uid].error == ""
    root = tmp / "plugin" / "dra-device-metadata"
    (root / f"{UID}_req-0.json").write_text("{}")  # a crash after the files, before the record
    (root / f".{UID}_req-1.json.tmp-1").write_text("{")  # a crash in the middle of one
    await prep.recover()
    assert sorted(p.name for p in root.glob("*.json")) == [f"{kept.uid}_req-0.json"]
    assert not (root / f".{UID}_req-1.json.tmp-1").exists()


def test_a_netdev_vf_carries_its_network_data(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["2x-h100-nic"](), tmp_path / "node")
    config = PfPoolConfig.model_validate({"pfs": [{"vendorID": "15b3"}]})
    vf = next(d for d in scan_vfs(host.sysfs_root, config) if d.name == "vf-0000-1a-00-2")
    prep = VfHandler(host.sysfs_root, host.dir / "dev").prepare(vf, UID, None)
    assert prep.network is not None
    netdev = prep.network["interfaceName"]
    assert f"_NETDEV={netdev}" in " ".join(prep.edits.env)
    (doc, _) = read_stream(stream(ClaimIdentity("ns", "c", UID), "nic", [
        MetadataDevice.of("node", vf, prep.network)
    ]))  # fmt: skip
    (device,) = doc["requests"][0]["devices"]
    assert device["networkData"]["interfaceName"] == netdev
    assert device["attributes"][PCI_BUS_ID] == {"string": "0000:1a:00.2"}


def test_a_device_written_again_reads_as_written_once_and_a_changed_one_as_itself() -> None:
    """stream() renders a device once per value (driver.claims.metadata
    _device_text): the bytes stay those of the whole document rendered anew,
    for a device seen before, one whose attribute changed, one with network
    data, and one whose attribute value is not a scalar."""
    from driver.claims.metadata import VERSIONS, document

    claim = ClaimIdentity("ns", "c", UID)

    def fresh(devices: list[MetadataDevice]) -> bytes:
        texts = [go_json(document(claim, "gpu", devices, v)) for v in VERSIONS]
        return "".join(t + "\n" for t in texts).encode()

    one = MetadataDevice("node-a", "gpu-0", {"uuid": {"string": "GPU-0"}, "minor": {"int": 0}})
    changed = MetadataDevice("node-a", "gpu-0", {"uuid": {"string": "GPU-9"}, "minor": {"int": 0}})
    routed = MetadataDevice("node-a", "vf-0", {}, {"interfaceName": "net1", "ips": ["10.0.0.2/24"]})
    odd = MetadataDevice("node-a", "gpu-1", {"list": {"string": ["not", "a", "scalar"]}})
    for devices in ([one], [one], [changed], [one, changed], [routed], [odd], [odd]):
        assert stream(claim, "gpu", devices) == fresh(devices)
    assert b"GPU-9" in stream(claim, "gpu", [changed])
