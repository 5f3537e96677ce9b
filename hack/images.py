"""`python hack/images.py ...`: the CLI of tests/harness/images.py.

The real-node tier's OCI image archives: build|path|list (stdlib only: the
system python3 runs it).

A thin entry point: the code is tests/harness/images.py (typed, imported by the
tests as ``tests.harness.images``); this puts the repository on the path and
runs its main(). Equivalent: ``python -m tests.harness.images ...`` from the
repository root.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.images import main

if __name__ == "__main__":
    sys.exit(main())
