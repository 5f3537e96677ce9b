"""Run every benchmark with its defaults and print the figures.

Each benchmark also runs alone with its own options, e.g.
``python -m tests.bench.plugin_bench --iterations 500``.
"""

from __future__ import annotations

import sys

from tests.bench import fabric_bench, mig_bench, plugin_bench, sched_bench, share_bench


def main() -> int:
    for bench in (plugin_bench, mig_bench, fabric_bench, sched_bench, share_bench):
        print(f"== {bench.__name__.rsplit('.', 1)[-1]}", flush=True)
        bench.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
