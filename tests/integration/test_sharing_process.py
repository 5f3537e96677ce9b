"""GPU sharing in the real plugin process: pynvml + the C mock, the simulated
host's nvidia-cuda-mps-control, real sockets, the real apiserver; this test
plays the kubelet.

An MPS claim over both GPUs, the plugin SIGKILLed at each step of its
prepare and unprepare (the preparer's crash points and the sharing step's
own): after a restart the kubelet's retry converges and the last unprepare
leaves no daemon process, no pipe or log directory, compute mode DEFAULT on
every GPU in the C mock's state, no CDI spec and an empty checkpoint.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import grpc
import pytest
from kubernetes import client
from simnode import PluginProcess

from driver.faults import PREPARE_POINTS, SHARING_POINTS, UNPREPARE_POINTS
from driver.gpu.sharing.mps import MpsDaemons
from tests.e2e.helpers import wait_for
from tests.integration.test_plugin_process import node, our_slices, plugin, wait_registered
from tests.kube.claims import allocated_claim
from tests.unit.test_gpu_sharing import MPS, daemons_of, gpu_config

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
__all__ = ["node", "plugin"]  # the fixtures this module uses

EXCLUSIVE_PROCESS = 3
UNPREPARE_SIDE = (*UNPREPARE_POINTS, "sharing-mps-stopped")


@pytest.fixture(autouse=True)
def no_mps_root_left(plugin: PluginProcess) -> Iterator[None]:
    """The host's MPS root lives outside its directory (a short socket path)."""
    yield
    shutil.rmtree(plugin.host.mps_root, ignore_errors=True)


def modes(plugin: PluginProcess) -> list[int]:
    return [int(g.get("compute_mode", 0)) for g in plugin.host.nvml.read()["gpus"]]


@pytest.mark.parametrize("point", PREPARE_POINTS + SHARING_POINTS + UNPREPARE_POINTS)
def test_crash_at_each_step_of_an_mps_claim_converges(
    point: str, plugin: PluginProcess, resource_api: client.ResourceV1Api, namespace: str, node: str
) -> None:
    config = [{**gpu_config(MPS, ["req-0", "req-1"]), "source": "FromClaim"}]
    uid = allocated_claim(resource_api, namespace, "c", node, ["gpu-0", "gpu-1"], config=config)
    claim = [(namespace, "c", uid)]
    wait_for("devices discovered", lambda: len(our_slices(resource_api, node)) == 1, timeout=30)
    plugin.stop()
    plugin.start(PATCHBAY_CRASH_POINT=point)
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    daemons = MpsDaemons(plugin.host.mps_control, plugin.host.mps_root)
    if point in UNPREPARE_SIDE:
        assert kubelet.prepare(endpoint, claim)[uid].error == ""
        assert daemons.running(daemons.directory(uid)) is not None
        assert modes(plugin) == [EXCLUSIVE_PROCESS] * 2
    with pytest.raises(grpc.RpcError):
        if point in UNPREPARE_SIDE:
            kubelet.unprepare(endpoint, claim)
        else:
            kubelet.prepare(endpoint, claim)
    assert plugin.wait_exit(10) != 0, "the plugin should have been killed at the crash point"
    plugin.start()
    kubelet = wait_registered(plugin)
    endpoint = kubelet.get_info().endpoint
    if point not in UNPREPARE_SIDE:
        assert kubelet.prepare(endpoint, claim)[uid].error == ""
        spec = json.loads((plugin.cdi_root / f"k8s.patchbay.dev-claim_{uid}.json").read_text())
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in spec["containerEdits"]["env"]
        assert daemons.running(daemons.directory(uid)) is not None
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert daemons_of(plugin.host.mps_root) == []
    assert not plugin.host.mps_root.exists() or list(plugin.host.mps_root.iterdir()) == []
    assert modes(plugin) == [0, 0]
    assert list(plugin.cdi_root.glob("*.json")) == []
    checkpoint = json.loads((plugin.plugin_dir / "checkpoint.json").read_text())
    assert checkpoint["claims"] == {}
