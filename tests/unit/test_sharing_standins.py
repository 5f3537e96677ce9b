"""The simulated host's stand-ins of NVIDIA's tools, as processes.

``nvidia-smi`` refuses a GPU the host does not have and an interval outside
0-3, changing nothing; ``nvidia-cuda-mps-control`` refuses a second daemon
on one pipe directory, answers its commands, validates a thread percentage
and, told ``quit``, removes its socket and pid file and exits; its client
without a daemon fails as the real one does."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.gpu.sharing.mps import PID_FILE, start_time
from fabric.simhost.host import SimHost
from fabric.simhost.nvidia_smi import read_record
from fabric.simhost.topologies import TOPOLOGIES


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["2-gpus"](), tmp_path / "h")


@pytest.fixture
def pipe_env() -> Iterator[dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="pbmps") as d:  # short: a socket path
        yield {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": f"{d}/pipe",
            "CUDA_MPS_LOG_DIRECTORY": f"{d}/log",
        }


def run(argv: list[str], env: dict[str, str] | None = None, stdin: str = "") -> tuple[int, str]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=30)
    return done.returncode, (done.stdout + done.stderr).strip()


def test_nvidia_smi_sets_known_gpus_only(host: SimHost) -> None:
    uuids = sorted(host.gpu_uuids().values())
    smi = str(host.nvidia_smi)
    assert run([smi, "compute-policy", "-i", "GPU-nope", "--set-timeslice", "2"])[0] != 0
    assert run([smi, "compute-policy", "-i", uuids[0], "--set-timeslice", "4"])[0] != 0
    assert read_record(host.dir)["calls"] == []
    assert run([smi, "compute-policy", "-i", ",".join(uuids), "--set-timeslice", "1"])[0] == 0
    assert read_record(host.dir)["timeslice"] == dict.fromkeys(uuids, 1)


def test_mps_control_daemon_and_client(host: SimHost, pipe_env: dict[str, str]) -> None:
    control = str(host.mps_control)
    assert run([control], pipe_env, "get_server_list\n") == (
        1,
        "Cannot find MPS control daemon process",
    )
    assert run([control, "-d"], pipe_env)[0] == 0
    pipe = Path(pipe_env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = int((pipe / PID_FILE).read_text())
    assert start_time(pid) is not None
    exited = os.pidfd_open(pid)  # readable once the daemon has exited
    try:
        assert run([control, "-d"], pipe_env) == (
            1,
            "An instance of this daemon is already running",
        )
        answer = run([control], pipe_env, "set_default_active_thread_percentage 0\n")
        assert answer[1].startswith("Invalid")
        assert run([control], pipe_env, "set_default_active_thread_percentage 30\n") == (0, "30.0")
        assert run([control], pipe_env, "get_default_active_thread_percentage\n") == (0, "30.0")
        # The client returns with the daemon's answer and the daemon then
        # removes its files and exits, as the real one shuts down after it
        # answers (the driver waits for the pid to go: driver.gpu.sharing.mps).
        assert run([control], pipe_env, "quit\n")[0] == 0
        assert select.select([exited], [], [], 30)[0] == [exited], "the daemon did not exit"
        assert not (pipe / PID_FILE).exists() and not (pipe / "control").exists()
    finally:
        if not select.select([exited], [], [], 0)[0]:
            signal.pidfd_send_signal(exited, signal.SIGKILL)
        os.close(exited)
