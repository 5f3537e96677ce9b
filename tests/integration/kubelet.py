"""The kubelet's side of the plugin protocol, played by a test over a real
plugin process's sockets: registration (GetInfo), NodePrepareResources and
NodeUnprepareResources; the wait until a started plugin answers, and the
node's ResourceSlices it published.

Why: the integration and e2e tests that run a real plugin process all play
the kubelet the same way; it lives here once, not in one of those tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from kubernetes import client

from plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from tests.e2e.helpers import wait_for
from tests.harness.simnode import PluginProcess


class Kubelet:
    """Plays the kubelet's part of the plugin protocol over the real sockets."""

    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir

    def reg_socket(self) -> Path:
        socks = sorted(self.registry_dir.glob("*.sock"))
        assert socks, f"no registration socket in {self.registry_dir}"
        return socks[0]

    def get_info(self) -> registration_pb2.PluginInfo:
        with grpc.insecure_channel(f"unix://{self.reg_socket()}") as ch:
            stub = registration_pb2_grpc.RegistrationStub(ch)
            info: registration_pb2.PluginInfo = stub.GetInfo(
                registration_pb2.InfoRequest(), timeout=1
            )
            stub.NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=True), timeout=1
            )
            return info

    def _stub(self, endpoint: str) -> tuple[grpc.Channel, dra_v1_pb2_grpc.DRAPluginStub]:
        ch = grpc.insecure_channel(f"unix://{endpoint}")
        return ch, dra_v1_pb2_grpc.DRAPluginStub(ch)

    def prepare(self, endpoint: str, claims: list[tuple[str, str, str]]) -> dict[str, Any]:
        ch, stub = self._stub(endpoint)
        with ch:
            req = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
            )
            return dict(stub.NodePrepareResources(req, timeout=45).claims)

    def unprepare(self, endpoint: str, claims: list[tuple[str, str, str]]) -> dict[str, Any]:
        ch, stub = self._stub(endpoint)
        with ch:
            req = dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
            )
            return dict(stub.NodeUnprepareResources(req, timeout=45).claims)


def wait_registered(proc: PluginProcess) -> Kubelet:
    kubelet = Kubelet(proc.registry_dir)

    def ready() -> bool:
        if not proc.alive:
            raise AssertionError(f"plugin exited:\n{proc.log_tail()}")
        try:
            kubelet.get_info()
        except (grpc.RpcError, AssertionError):
            return False  # not bound yet, or a stale socket of a killed process
        return True

    wait_for("plugin answering GetInfo", ready, timeout=30)
    return kubelet


def our_slices(resource_api: client.ResourceV1Api, node: str) -> list[client.V1ResourceSlice]:
    return list(resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items)
