"""Subprocess entry: one prepare-overlap scenario (``tests.unit.prepare_overlap``)
over pynvml and the C mock.

    python -m tests.contract.overlap_runner SCENARIO WORKDIR

The parent (``tests/contract/test_prepare_overlap_mock.py``) sets
``LD_LIBRARY_PATH`` to the mock and ``PATCHBAY_NVML_STATE`` to its state
file, whose GPUs (GPU-0000, GPU-0001, H100) are the node's. The MIG
instances a GPU has are read back from the state file the mock keeps, so
the count is the mock's, not the handler's. Exit status 0: passed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from driver.nvml.pynvml_backend import PynvmlBackend
from tests.unit.mig_node import Node
from tests.unit.prepare_overlap import SCENARIOS


def instances(state: Path, uuid: str) -> int:
    """The GPU instances the mock holds on GPU ``uuid`` now."""
    gpus = json.loads(state.read_text())["gpus"]
    return len(next(g for g in gpus if g["uuid"] == uuid)["gpu_instances"])


def main(argv: list[str]) -> int:
    scenario, workdir = argv[0], Path(argv[1])
    state = Path(os.environ["PATCHBAY_NVML_STATE"])
    node = Node(backend=PynvmlBackend())
    asyncio.run(SCENARIOS[scenario](workdir, node, lambda uuid: instances(state, uuid)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
