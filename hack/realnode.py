"""`python hack/realnode.py ...`: the CLI of tests/harness/realnode.py.

The control plane and two real nodes (kubelet, containerd in namespaces):
up|down|status.

A thin entry point: the code is tests/harness/realnode.py (typed, imported by the
tests as ``tests.harness.realnode``); this puts the repository on the path and
runs its main(). Equivalent: ``python -m tests.harness.realnode ...`` from the
repository root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.realnode import main

if __name__ == "__main__":
    sys.exit(main())
