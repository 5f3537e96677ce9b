"""`python hack/demo.py ...`: the CLI of tests/harness/demo.py.

``make demo`` / ``make demo-down``: patchbay on real nodes with example
workloads: up|down.

A thin entry point: the code is tests/harness/demo.py (typed, imported by the
tests as ``tests.harness.demo``); this puts the repository on the path and
runs its main(). Equivalent: ``python -m tests.harness.demo ...`` from the
repository root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.demo import main

if __name__ == "__main__":
    sys.exit(main())
