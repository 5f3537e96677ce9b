"""Fixtures of the contract suite: the C mock, built on demand.

``make -s nvml-mock`` rebuilds the library only when its sources changed.
Where the build fails the C-mock half is skipped, except under ``CI=true``,
where a failed build fails the run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.contract.world import REPO

LIB = REPO / "hack" / "nvml-mock" / "build" / "libnvidia-ml.so.1"


@pytest.fixture(scope="session")
def nvml_mock_dir() -> Path:
    proc = subprocess.run(
        ["make", "-s", "nvml-mock"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not LIB.exists():
        msg = f"building the NVML mock failed:\n{proc.stdout}\n{proc.stderr}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return LIB.parent
