"""Where a benchmark keeps its run (control plane, hosts, logs), and that it
goes when the benchmark ends.

Why this module exists: the benches left every run's directory in /tmp (45
runs, 6 GB, found in issue 36's session); a bench leaves the machine as it
found it. ``PATCHBAY_BENCH_KEEP=1`` keeps the directory for reading its logs
afterwards, and says where it is.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

KEEP_ENV = "PATCHBAY_BENCH_KEEP"


def bench_dir(prefix: str) -> Path:
    """A new directory under /tmp, removed when the process exits (after the
    bench's own ``finally`` has stopped what runs there), unless kept."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    atexit.register(_leave, path)
    return path


def _leave(path: Path) -> None:
    if os.environ.get(KEEP_ENV) == "1":
        print(f"kept the run's directory: {path}", file=sys.stderr)
    else:
        shutil.rmtree(path, ignore_errors=True)
