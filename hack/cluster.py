"""`python hack/cluster.py ...`: the CLI of tests/harness/cluster.py.

The local control plane (etcd, apiserver, scheduler, controller-manager):
up|down|status.

A thin entry point: the code is tests/harness/cluster.py (typed, imported by the
tests as ``tests.harness.cluster``); this puts the repository on the path and
runs its main(). Equivalent: ``python -m tests.harness.cluster ...`` from the
repository root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.cluster import main

if __name__ == "__main__":
    sys.exit(main())
