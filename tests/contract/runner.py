"""Subprocess entry for the C-mock side of the contract suite.

    python -m tests.contract.runner SCENARIO        run one scenario
    python -m tests.contract.runner --call METHOD ARGS_JSON
                                                    one backend call, result as JSON

The parent sets ``LD_LIBRARY_PATH`` (so pynvml's ``CDLL("libnvidia-ml.so.1")``
finds the mock exactly as it would find the real library) and
``PATCHBAY_NVML_STATE``. Exit status 0 means the scenario passed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.contract.registry import SCENARIOS
from tests.contract.world import MockWorld, plain


def main(argv: list[str]) -> int:
    world = MockWorld(Path(os.environ["PATCHBAY_NVML_STATE"]))
    if argv[0] == "--call":
        backend = world.backend()
        backend.init()
        try:
            result = getattr(backend, argv[1])(*json.loads(argv[2]))
        finally:
            backend.shutdown()
        print(json.dumps(plain(result)))
        return 0
    SCENARIOS[argv[0]](world)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
