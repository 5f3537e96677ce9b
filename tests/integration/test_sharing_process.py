"""GPU sharing in the real plugin process: pynvml + the C mock, the simulated
host's nvidia-cuda-mps-control, real sockets, the real apiserver; this test
plays the kubelet.

The plugin runs with ``--mps-supervisor`` and ``patchbay-mps-supervisor``
runs as a process beside it, as the chart runs the two (a pod each): the
daemons are the supervisor's, told through want/ready files in the host's
MPS root. An MPS claim over both GPUs, the plugin SIGKILLed at each step of
its prepare and unprepare (the preparer's crash points and the sharing
step's own), or the supervisor SIGKILLed at each of its own: after a restart
the kubelet's retry converges and the last unprepare leaves no daemon
process, no pipe or log directory, compute mode DEFAULT on every GPU in the
C mock's state, no CDI spec and an empty checkpoint. A daemon outlives both
a plugin kill and a supervisor kill (the same pid, adopted).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from driver.faults import MPS_POINTS, PREPARE_POINTS, SHARING_POINTS, UNPREPARE_POINTS
from driver.gpu.sharing.mps import MpsDaemons
from driver.gpu.sharing.supervisor import READY_FILE, WANT_FILE
from tests.checkpoint_view import recorded
from tests.e2e.helpers import wait_for
from tests.harness.simnode import PluginProcess
from tests.integration.kubelet import Kubelet, our_slices, wait_registered
from tests.integration.plugin_fixtures import node, plugin
from tests.kube.claims import allocated_claim
from tests.sharing_claims import MPS, daemons_of, gpu_config

pytestmark = [pytest.mark.integration, pytest.mark.cluster]
__all__ = ["node", "plugin"]  # the fixtures this module uses

REPO = Path(__file__).resolve().parents[2]
EXCLUSIVE_PROCESS = 3
UNPREPARE_SIDE = (*UNPREPARE_POINTS, "sharing-mps-stopped")


class Supervisor:
    """``patchbay-mps-supervisor`` as a process beside the plugin."""

    def __init__(self, plugin: PluginProcess) -> None:
        self.host = plugin.host
        self.log_path = plugin.log_path.with_name("mps-supervisor.log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, **env: str) -> Supervisor:
        argv = [sys.executable, "-m", "plugin.mps_supervisor", "--log-level=debug"]
        argv += [f"--mps-control={self.host.mps_control}", f"--mps-root={self.host.mps_root}"]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env={**os.environ, "PYTHONPATH": str(REPO), **env},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def supervisor(plugin: PluginProcess) -> Iterator[Supervisor]:
    """A supervisor beside the plugin, which now runs with --mps-supervisor."""
    plugin.extra_env["MPS_SUPERVISOR"] = "true"
    sup = Supervisor(plugin)
    yield sup
    sup.kill()
    for pid in running_pids(plugin):  # never leave one behind a failed test
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(plugin.host.mps_root, ignore_errors=True)


def host_daemons(plugin: PluginProcess) -> MpsDaemons:
    """The MPS daemons of the plugin's simulated host, as the plugin sees them."""
    return MpsDaemons(plugin.host.mps_control, plugin.host.mps_root)


def running_pids(plugin: PluginProcess) -> list[int]:
    """The MPS control daemons running under the host's MPS root."""
    return daemons_of(plugin.host.mps_root)


def modes(plugin: PluginProcess) -> list[int]:
    return [int(g.get("compute_mode", 0)) for g in plugin.host.nvml.read()["gpus"]]


def mps_claim(
    plugin: PluginProcess, api: client.ResourceV1Api, namespace: str, node: str
) -> tuple[str, list[tuple[str, str, str]]]:
    config = [{**gpu_config(MPS, ["req-0", "req-1"]), "source": "FromClaim"}]
    uid = allocated_claim(api, namespace, "c", node, ["gpu-0", "gpu-1"], config=config)
    wait_for("devices discovered", lambda: len(our_slices(api, node)) == 1, timeout=30)
    return uid, [(namespace, "c", uid)]


def restart(plugin: PluginProcess, **env: str) -> tuple[Kubelet, str]:
    plugin.stop()
    plugin.start(**env)
    kubelet = wait_registered(plugin)
    return kubelet, kubelet.get_info().endpoint


def assert_nothing_left(plugin: PluginProcess) -> None:
    assert running_pids(plugin) == []
    assert not plugin.host.mps_root.exists() or list(plugin.host.mps_root.iterdir()) == []
    assert modes(plugin) == [0, 0]
    assert list(plugin.cdi_root.glob("*.json")) == []
    checkpoint = recorded(plugin.plugin_dir / "checkpoint.json")
    assert checkpoint["claims"] == {}


@pytest.mark.parametrize("point", PREPARE_POINTS + SHARING_POINTS + UNPREPARE_POINTS)
def test_plugin_crash_at_each_step_of_an_mps_claim_converges(
    point: str,
    plugin: PluginProcess,
    supervisor: Supervisor,
    resource_api: client.ResourceV1Api,
    namespace: str,
    node: str,
) -> None:
    uid, claim = mps_claim(plugin, resource_api, namespace, node)
    supervisor.start()
    kubelet, endpoint = restart(plugin, PATCHBAY_CRASH_POINT=point)
    daemons = host_daemons(plugin)
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
        assert len(running_pids(plugin)) == 1
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert_nothing_left(plugin)


def _through_a_supervisor_crash(sup: Supervisor, call: Callable[[], dict[str, Any]]) -> Any:
    """``call`` (a kubelet call) while the supervisor dies at its crash point and
    is started again: the plugin's wait sees the restarted one answer."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call)
        assert sup.wait_exit(30) != 0, "the supervisor should have been killed at the crash point"
        sup.start()
        return pending.result(timeout=45)


@pytest.mark.parametrize("point", MPS_POINTS)
def test_supervisor_crash_at_each_step_converges(
    point: str,
    plugin: PluginProcess,
    supervisor: Supervisor,
    resource_api: client.ResourceV1Api,
    namespace: str,
    node: str,
) -> None:
    uid, claim = mps_claim(plugin, resource_api, namespace, node)
    kubelet, endpoint = restart(plugin)
    daemons = host_daemons(plugin)
    supervisor.start(PATCHBAY_CRASH_POINT=point)
    if point == "mps-daemon-stopped":
        assert kubelet.prepare(endpoint, claim)[uid].error == ""
        result = _through_a_supervisor_crash(supervisor, lambda: kubelet.unprepare(endpoint, claim))
        assert result[uid].error == ""
        assert_nothing_left(plugin)
        return
    result = _through_a_supervisor_crash(supervisor, lambda: kubelet.prepare(endpoint, claim))
    assert result[uid].error == ""
    # One daemon: the one a crash left before its daemon.json was killed.
    pid = daemons.running(daemons.directory(uid))
    assert running_pids(plugin) == [pid]
    assert modes(plugin) == [EXCLUSIVE_PROCESS] * 2
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert_nothing_left(plugin)


def test_the_daemon_outlives_a_plugin_kill_and_a_supervisor_kill(
    plugin: PluginProcess,
    supervisor: Supervisor,
    resource_api: client.ResourceV1Api,
    namespace: str,
    node: str,
) -> None:
    uid, claim = mps_claim(plugin, resource_api, namespace, node)
    supervisor.start()
    kubelet, endpoint = restart(plugin)
    assert kubelet.prepare(endpoint, claim)[uid].error == ""
    daemons = host_daemons(plugin)
    directory = daemons.directory(uid)
    pid = daemons.running(directory)
    assert pid is not None and running_pids(plugin) == [pid]
    plugin.kill()  # SIGKILL: a rolling update ends the plugin's container too
    kubelet, endpoint = restart(plugin)  # its start-up wants the claim's daemon again
    supervisor.kill()
    supervisor.start()

    def answered() -> bool:  # the restarted supervisor answered the plugin's start-up want
        want = json.loads((directory / WANT_FILE).read_text())
        ready = json.loads((directory / READY_FILE).read_text())
        return bool(ready["request"] == want["request"] and ready["pid"] == pid)

    wait_for("the same daemon adopted and ready", answered, timeout=30)
    assert daemons.running(directory) == pid and running_pids(plugin) == [pid]
    assert kubelet.unprepare(endpoint, claim)[uid].error == ""
    assert_nothing_left(plugin)
