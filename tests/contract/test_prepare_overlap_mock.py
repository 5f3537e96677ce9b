"""Which prepares may overlap (issue 36) over pynvml and the C mock: MIG
claims on two GPUs overlap and never on one GPU; a whole GPU and a MIG
placement on it take turns and exactly one gets it. The scenarios are
``tests/unit/prepare_overlap.py``'s (the fake NVML runs them in
``tests/unit/test_prepare_overlap.py``); here each runs in a fresh
subprocess whose ``LD_LIBRARY_PATH`` points at the mock, so pynvml loads it
by soname as it loads the real library.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.world import SimGpu, run_in_mock, write_state
from tests.unit.prepare_overlap import SCENARIOS

GPUS = [
    SimGpu(f"GPU-{i:04d}", "H100-SXM5-80GB", f"0000:{0x10 + i:02x}:00.0", f"S{i}", i)
    for i in range(2)
]


@pytest.mark.integration
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_c_mock(scenario: str, nvml_mock_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.json"
    write_state(state, GPUS)
    work = tmp_path / "work"
    work.mkdir()
    run_in_mock(nvml_mock_dir, state, "tests.contract.overlap_runner", scenario, str(work))
