"""Small Go helpers under hack/, built once per source change and cached.

Why: some unit tests compare our Python with the Go libraries Kubernetes
itself runs (``hack/metadata-go``: the kubelet-plugin Helper's metadata
files; ``hack/dra-cel``: the scheduler's CEL for device selectors). Each is
built into ``~/.cache/patchbay/<name>/<hash of its sources>/<name>`` with
the Go modules and build cache under ``~/.cache/patchbay/go``: the first
build downloads the modules (minutes on a busy 2-core machine), later runs
reuse the binary. Without a Go toolchain the test is skipped, saying so
(a failure under CI=true: ``missing_prerequisite``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cluster_fixtures import missing_prerequisite

HACK = Path(__file__).resolve().parents[2] / "hack"
CACHE = Path.home() / ".cache" / "patchbay"
GO_DEFAULT = "/usr/local/go/bin/go"  # where the project's machines have it
SOURCES = ("go.mod", "go.sum", "main.go")


def go() -> str:
    found = shutil.which("go") or (GO_DEFAULT if os.access(GO_DEFAULT, os.X_OK) else None)
    if found is None:
        missing_prerequisite("no Go toolchain: the Go helpers under hack/ cannot be built")
    assert found is not None
    return found


def built(name: str) -> Path:
    """The binary of ``hack/<name>`` for its current sources, built if missing."""
    source = HACK / name
    digest = hashlib.sha256()
    for part in SOURCES:
        digest.update((source / part).read_bytes())
    binary = CACHE / name / digest.hexdigest()[:16] / name
    if not binary.exists():
        env = os.environ | {
            "GOMODCACHE": str(CACHE / "go" / "mod"),
            "GOCACHE": str(CACHE / "go" / "build"),
            "GOFLAGS": "-mod=readonly",
            "GOTOOLCHAIN": "local",
        }
        tmp = binary.with_name(f".{name}.tmp-{os.getpid()}")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([go(), "build", "-o", str(tmp), "."], cwd=source, env=env, check=True)
        tmp.rename(binary)
    return binary


def main(names: list[str]) -> int:
    """Build the named helpers (``make go-helpers``), so that a test never waits
    for a cold Go build under its own timeout."""
    for name in names:
        print(f"{name}: {built(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
