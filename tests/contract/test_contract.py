"""Every contract scenario against the in-memory fake and against pynvml + the C mock.

The C-mock variant runs each scenario in a fresh Python subprocess whose
``LD_LIBRARY_PATH`` points at the mock, so pynvml loads it by soname exactly
as it loads the real driver library, and the library's process state never
leaks between scenarios.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.registry import SCENARIOS
from tests.contract.scenarios import GPUS
from tests.contract.world import FakeWorld, run_in_mock, write_state


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fake(scenario: str) -> None:
    SCENARIOS[scenario](FakeWorld(GPUS))


@pytest.mark.integration
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_c_mock(scenario: str, nvml_mock_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "nvml-state.json"
    write_state(state, GPUS)
    run_in_mock(nvml_mock_dir, state, "tests.contract.runner", scenario)


@pytest.mark.integration
def test_c_mock_abi(nvml_mock_dir: Path, tmp_path: Path) -> None:
    """Raw pynvml entry points and struct checks the backend does not reach."""
    state = tmp_path / "nvml-state.json"
    write_state(state, GPUS)
    run_in_mock(nvml_mock_dir, state, "tests.contract.abi_probe")
