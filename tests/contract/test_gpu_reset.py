"""The GPU reset over the real path: pynvml loading the C mock, the XID
watcher's event set holding the GPU, the simulated host's nvidia-smi.

Proves: the mock records an event set's process as a holder and nvidia-smi
refuses to reset a held GPU; :class:`driver.health.reset.NodeGpuOps` lets
the watcher go first, so the reset goes through (without the pause it is
refused: the first step shows it), clears the recovery action, the pending
row remap and the ECC count, and the watcher delivers XIDs again after it;
a CUDA process on the GPU and a failing reset are told apart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fabric.simhost import TOPOLOGIES, SimHost
from fabric.simhost.nvidia_smi import read_record
from tests.contract.world import REPO, mock_env


@pytest.mark.integration
def test_the_reset_path_over_pynvml_and_the_mock(nvml_mock_dir: Path, tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["2-gpus"](), tmp_path / "node")
    env = mock_env(nvml_mock_dir, host.nvml_state_path)
    out = subprocess.run(
        [sys.executable, "-m", "tests.contract.gpu_reset_runner", str(host.dir)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    calls = read_record(host.dir)["calls"]
    assert isinstance(calls, list)
    assert [c[0] for c in calls] == ["--gpu-reset"] * 4  # held, done, process, failed
