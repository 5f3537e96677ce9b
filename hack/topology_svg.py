"""`python hack/topology_svg.py ...`: the CLI of tests/harness/topology_svg.py.

render docs/img/topology-node-a.svg from a real e2e-tier run.

A thin entry point: the code is tests/harness/topology_svg.py (typed, imported by the
tests as ``tests.harness.topology_svg``); this puts the repository on the path and
runs its main(). Equivalent: ``python -m tests.harness.topology_svg ...`` from the
repository root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.topology_svg import main

if __name__ == "__main__":
    sys.exit(main())
