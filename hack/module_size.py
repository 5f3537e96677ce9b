"""Fail when a hand-written module grows past the size we allow.

Modules should hold one concept in 60-300 lines; past ~400 they must be split.
Generated protobuf stubs are exempt.
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 450
ROOTS = ("driver", "plugin", "fabric", "hack", "tests")


def main() -> int:
    top = Path(__file__).resolve().parent.parent
    bad = []
    for root in ROOTS:
        for path in sorted((top / root).rglob("*.py")):
            if "_pb2" in path.name or ".venv" in path.parts:
                continue
            n = sum(1 for _ in path.open(encoding="utf-8"))
            if n > LIMIT:
                bad.append(f"{path.relative_to(top)}: {n} lines (limit {LIMIT})")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
