"""Our device metadata files against the ones the Go library itself writes.

``hack/metadata-go`` runs ``k8s.io/dynamic-resource-allocation`` v0.37.2's
kubelet-plugin Helper (device metadata on, v1beta1 + v1alpha1) over a fake
clientset and calls NodePrepareResources on it, as the kubelet would. Built
once per source change (``tests.harness.gotool``: the first build downloads
the modules and compiles client-go and gRPC, minutes on a busy 2-core
machine; later runs reuse the binary). Skipped, saying so, only where no Go
toolchain is installed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from driver.claims.metadata import ClaimIdentity, MetadataDevice
from driver.claims.metadata_files import MetadataFiles
from tests.harness import gotool

UID = "5f0c1d2e-8a7b-4c3d-9e1f-0a1b2c3d4e5f"


@pytest.fixture(scope="module")
def metadata_go() -> Path:
    return gotool.built("metadata-go")


ATTRS: dict[str, dict[str, Any]] = {
    "type": {"string": "gpu"},
    "uuid": {"string": "GPU-1d2e"},
    "productName": {"string": "A100 <SXM4> & co, é"},
    "minor": {"int": 3},
    "dynamicMig": {"bool": False},
    "driverVersion": {"version": "580.65.6"},
    "resource.kubernetes.io/pciBusID": {"string": "0000:17:00.0"},
    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:16"},
}
NET = {"interfaceName": "ens1f0v2", "hardwareAddress": "02:00:00:aa:bb:cc"}
# (requests, pool, device, attributes, network data)
DEVICES = [
    (["gpus/large"], "node-a", "gpu-0", ATTRS, None),
    (["gpus/large"], "node-a", "gpu-1", {"type": {"string": "gpu"}}, None),
    (["nic"], "node-a", "vf-0000-17-00-2", {"type": {"string": "vf"}}, NET),
]


def claim(pod_claim_name: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "pod-1-gpus-x7k2p", "uid": UID}
    if pod_claim_name is not None:
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim_name}
    results = [
        {"request": r[0], "driver": "patchbay.dev", "pool": p, "device": d}
        for r, p, d, _, _ in DEVICES
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}},
    }


@pytest.mark.parametrize("pod_claim_name", ["gpus", None])
def test_same_bytes_as_the_go_library(
    metadata_go: Path, tmp_path: Path, pod_claim_name: str | None
) -> None:
    obj = claim(pod_claim_name)
    devices = [
        {
            "requests": r,
            "pool": p,
            "device": d,
            "cdiDeviceIDs": [f"k8s.patchbay.dev/claim={UID}-{d}"],
            "attributes": a,
            "networkData": n,
        }
        for r, p, d, a, n in DEVICES
    ]
    (tmp_path / "in.json").write_text(json.dumps({"claim": obj, "devices": devices}))
    out = tmp_path / "go"
    subprocess.run([str(metadata_go), str(tmp_path / "in.json"), str(out)], check=True, timeout=60)

    ours = MetadataFiles(tmp_path / "ours")
    files = ours.write_claim(
        ClaimIdentity.of(obj, UID),
        [(r, MetadataDevice(p, d, a, n)) for r, p, d, a, n in DEVICES],
    )
    go_dir = out / "plugin" / "dra-device-metadata" / "ns_pod-1-gpus-x7k2p"
    assert sorted(p.name for p in go_dir.iterdir()) == sorted(f.request for f in files)
    for f in files:
        theirs = (go_dir / f.request / "metadata.json").read_bytes()  # the library's layout
        assert ours.path(UID, f.request).read_bytes() == theirs, f.request
        (spec_path,) = (out / "cdi").glob(f"patchbay.dev_metadata_{UID}_{f.request}.json")
        (go_mount,) = json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["mounts"]
        ((_, container_path),) = f.device.edits.mounts
        assert container_path == go_mount["containerPath"]
        assert "ro" in go_mount["options"]
    # The answer: the metadata ID on the first device of each request only.
    answer = json.loads((out / "response.json").read_text())["claims"][UID]["devices"]
    with_ids = [d["device_name"] for d in answer if len(d["cdi_device_ids"]) == 2]
    assert with_ids == ["gpu-0", "vf-0000-17-00-2"]
