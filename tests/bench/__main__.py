"""Run every benchmark and print its figures."""

from __future__ import annotations

import sys

from tests.bench import mig_bench, plugin_bench


def main() -> int:
    mig_bench.main(sys.argv[1:])
    plugin_bench.main(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
