"""Device metadata (KEP-5304) over the plugin's real DRA socket, this test
playing the kubelet: the NodePrepareResources answer carries the metadata
CDI ID on the first device of the request (both DRA versions), the claim's
CDI spec mounts the file read-only at the upstream container path, and
NodeUnprepareResources removes it. Fails without the feature: no ID, no
mount, no file. The preparer is the real one (checkpoint, CDI registry,
metadata files); the claim comes from a reader double, the GPUs from the
claim preparer's GPU handler double (tests/claims_doubles.py).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.metadata import CONTAINER_DIR, POD_CLAIM_NAME_ANNOTATION, read_stream
from driver.claims.metadata_files import MetadataFiles
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import PCI_BUS_ID, Device
from plugin.grpc_server import PluginServers
from plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from plugin.sockets import socket_paths
from tests.claims_doubles import NODE, FlakyHandler, Reader

pytestmark = pytest.mark.integration


@pytest.fixture
def top() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="pb-md-"))  # short: socket paths
    yield path
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


def mounted(cdi: Path, uid: str, request: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The mount of ``request``'s metadata file in the claim's CDI spec; the file's objects."""
    spec = json.loads((cdi / f"k8s.patchbay.dev-claim_{uid}.json").read_text())
    (entry,) = [d for d in spec["devices"] if d["name"] == f"{uid}-metadata_{request}"]
    (mount,) = entry["containerEdits"]["mounts"]
    return mount, read_stream(Path(mount["hostPath"]).read_bytes())


def leftovers(plugin_dir: Path) -> list[Path]:
    return list((plugin_dir / "dra-device-metadata").glob("*.json"))


@pytest.mark.parametrize(
    "pb2,pb2_grpc", [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]
)
async def test_answer_carries_the_metadata_id_and_the_spec_mounts_the_file(
    top: Path, pb2: Any, pb2_grpc: Any
) -> None:
    inventory = NodeInventory()
    bdf = {i: f"0000:{0x17 + i:02x}:00.0" for i in range(2)}
    inventory.replace_pool(
        NODE,
        [
            Device(
                f"gpu-{i}", "gpu", f"GPU-{i}", attributes={"uuid": f"GPU-{i}", PCI_BUS_ID: bdf[i]}
            )
            for i in range(2)
        ],
    )
    reader = Reader()
    ref = reader.add("pod-1-gpus-x7k2p", ["gpu-0", "gpu-1"])
    claim = reader.claims[("ns", ref.name)]
    claim["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpus"}
    for result in claim["status"]["allocation"]["devices"]["results"]:
        result["request"] = "gpus/large"  # one request, through a subrequest
    plugin_dir = top / "plug"
    preparer = ClaimPreparer(
        reader,
        inventory,
        {"gpu": FlakyHandler(top / "dev")},
        CheckpointStore(plugin_dir / "checkpoint.json", "boot"),
        CdiRegistry(top / "cdi"),
        metadata=MetadataFiles.in_plugin_dir(plugin_dir),
    )
    paths = socket_paths(top / "reg", plugin_dir)
    servers = PluginServers(paths, preparer)
    await servers.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{paths.dra}") as ch:
            stub = pb2_grpc.DRAPluginStub(ch)
            claims = [pb2.Claim(namespace="ns", name=ref.name, uid=ref.uid)]
            resp = await stub.NodePrepareResources(
                pb2.NodePrepareResourcesRequest(claims=claims), timeout=10
            )
            answer = resp.claims[ref.uid]
            assert answer.error == ""
            first, second = answer.devices
            prefix = f"k8s.patchbay.dev/claim={ref.uid}"
            assert list(first.request_names) == ["gpus"]
            assert list(first.cdi_device_ids) == [f"{prefix}-gpu-0", f"{prefix}-metadata_gpus"]
            assert list(second.cdi_device_ids) == [f"{prefix}-gpu-1"]

            mount, (newest, oldest) = mounted(top / "cdi", ref.uid, "gpus")
            assert mount["containerPath"] == (
                f"{CONTAINER_DIR}/resourceclaimtemplates/gpus/gpus/patchbay.dev-metadata.json"
            )
            assert mount["options"][0] == "ro" and "bind" in mount["options"]
            assert (newest["apiVersion"], oldest["apiVersion"]) == (
                "metadata.resource.k8s.io/v1beta1",
                "metadata.resource.k8s.io/v1alpha1",
            )
            (request,) = newest["requests"]
            assert request["name"] == "gpus/large"
            assert [d["attributes"][PCI_BUS_ID] for d in request["devices"]] == [
                {"string": bdf[0]},
                {"string": bdf[1]},
            ]

            uresp = await stub.NodeUnprepareResources(
                pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=10
            )
            assert uresp.claims[ref.uid].error == ""
            assert leftovers(plugin_dir) == []
    finally:
        await servers.stop()
