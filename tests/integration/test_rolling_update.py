"""Rolling update: two plugin pods on one node at once (sockets named with
their pod UIDs) share the checkpoint under a cross-process lock, so a claim
prepared by the old pod is known to, and unprepared by, the new one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from fabric.simhost.topologies import TOPOLOGIES
from plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc, registration_pb2, registration_pb2_grpc
from tests.checkpoint_view import recorded
from tests.e2e.helpers import wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.own_node import own_node
from tests.kube.claims import allocated_claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def endpoint_of(reg_socket: Path) -> str | None:
    try:
        with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
            info = registration_pb2_grpc.RegistrationStub(ch).GetInfo(
                registration_pb2.InfoRequest(), timeout=1
            )
            return str(info.endpoint)
    except grpc.RpcError:
        return None


def call(endpoint: str, method: str, ns: str, name: str, uid: str) -> str:
    claim = [dra_v1_pb2.Claim(namespace=ns, name=name, uid=uid)]
    with grpc.insecure_channel(f"unix://{endpoint}") as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        if method == "prepare":
            out = stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claim))
        else:
            out = stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claim)
            )
        return str(out.claims[uid].error)


@pytest.fixture
def two_pods(
    local_cluster: LocalCluster, core: client.CoreV1Api
) -> Iterator[tuple[PluginProcess, PluginProcess]]:
    with own_node(local_cluster, core, "ru-node", TOPOLOGIES["2-gpus"]()) as node:
        old, new = (
            node.plugin(f"--pod-uid={uuid.uuid4()}", log_name=str(i)).start() for i in range(2)
        )
        yield old, new


def test_new_pod_unprepares_what_the_old_one_prepared(
    two_pods: tuple[PluginProcess, PluginProcess],
    resource_api: client.ResourceV1Api,
    namespace: str,
) -> None:
    old, _new = two_pods
    node = old.node_name

    def endpoints() -> list[str] | None:
        socks = sorted(old.registry_dir.glob("patchbay.dev-*-reg.sock"))
        found = [e for e in (endpoint_of(s) for s in socks) if e]
        return found if len(found) == 2 else None

    eps = wait_for("two registration sockets with pod UIDs", endpoints, timeout=30)
    old_ep, new_ep = (e for e in eps)
    assert old_ep != new_ep and all("dra-" in e for e in eps)
    wait_for(
        "pool published",
        lambda: resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items,
        timeout=30,
    )
    first = allocated_claim(resource_api, namespace, "first", node, ["gpu-0"])
    second = allocated_claim(resource_api, namespace, "second", node, ["gpu-0"])
    assert call(old_ep, "prepare", namespace, "first", first) == ""
    # The new pod reads the shared checkpoint: gpu-0 is taken.
    assert "already prepared" in call(new_ep, "prepare", namespace, "second", second)
    assert call(new_ep, "unprepare", namespace, "first", first) == ""
    assert list(old.cdi_root.glob("*.json")) == []
    assert recorded(old.plugin_dir / "checkpoint.json")["claims"] == {}
    assert call(new_ep, "prepare", namespace, "second", second) == ""
