"""Which prepares may overlap (issue 36), over the fake NVML: claims on
different GPUs do; claims on one GPU never, MIG placements on one GPU never,
a whole GPU and a MIG placement on it never (and exactly one of the two gets
the GPU). The scenarios and what makes them fail: ``tests/unit/prepare_overlap.py``;
the same over pynvml and the C mock: ``tests/contract/test_prepare_overlap_mock.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.mig_node import Node
from tests.unit.prepare_overlap import SCENARIOS


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_fake_nvml(scenario: str, tmp_path: Path) -> None:
    node = Node()
    await SCENARIOS[scenario](tmp_path, node, lambda uuid: len(node.gpu(uuid).instances))
