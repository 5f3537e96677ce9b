"""A simulated host's NVML state, read through pynvml + the C mock.

Checks the two halves agree (the simulated host writes what the mock reads)
and that ``PATCHBAY_NVML_LIBRARY`` works as the in-process hook for loading
the mock without ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from driver.pci import sysfs
from fabric.simhost import TOPOLOGIES, SimHost
from fabric.simhost.topology import Gpu
from tests.contract.world import REPO, mock_env


def call(env: dict[str, str], method: str, *args: object) -> object:
    out = subprocess.run(
        [sys.executable, "-m", "tests.contract.runner", "--call", method, json.dumps(args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.integration
def test_simhost_gpus_through_pynvml(nvml_mock_dir: Path, tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["8x-a100"](), tmp_path / "node")
    env = mock_env(nvml_mock_dir, host.nvml_state_path)
    gpus = call(env, "gpus")
    assert isinstance(gpus, list) and len(gpus) == 8
    assert [g["pci_bus_id"] for g in gpus] == sorted(host.gpu_uuids())
    assert {g["product_name"] for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    roots = [sysfs.pcie_root(host.sysfs_root, g["pci_bus_id"]) for g in gpus]
    assert sorted(set(roots)) == ["pci0000:07", "pci0000:47", "pci0000:87", "pci0000:b7"]


@pytest.mark.integration
def test_library_hook_and_hot_add(nvml_mock_dir: Path, tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path / "node")
    env = mock_env(nvml_mock_dir, host.nvml_state_path)
    del env["LD_LIBRARY_PATH"]
    env["PATCHBAY_NVML_LIBRARY"] = str(nvml_mock_dir / "libnvidia-ml.so.1")
    assert call(env, "gpus") == []
    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", Gpu(bdf, "H100-SXM5-80GB"))
    gpus = call(env, "gpus")
    assert isinstance(gpus, list)
    (gpu,) = gpus
    assert gpu["pci_bus_id"] == bdf and gpu["uuid"] == host.gpu_uuids()[bdf]
