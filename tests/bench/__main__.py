"""Run every benchmark with its defaults and print the figures, or one by name.

``python -m tests.bench`` runs the default set; ``python -m tests.bench
<name> [options]`` runs one (``make bench BENCH=<name>``), e.g.
``python -m tests.bench soak --soak-seconds 120``. Each also runs alone as
its module, e.g. ``python -m tests.bench.plugin_bench --iterations 500``.
The soak (10 minutes by default), the scale bench (a control plane per
size, 100 and 500 nodes by default: ``make bench BENCH=scale``) and the
warm-spares bench (``make bench BENCH=spares``), the GPU health bench
(``make bench BENCH=health``: XID to capacity restored) and the ``+me`` placement
evidence (``make bench BENCH=mig_media``) and the repeated fabric e2e module
(``make bench BENCH=repeat``) are not in the default set.
"""

from __future__ import annotations

import sys
from types import ModuleType

from tests.bench import (
    burst_bench,
    checkpoint_bench,
    fabric_bench,
    health_bench,
    idle_bench,
    mig_bench,
    mig_media,
    plugin_bench,
    repeat_bench,
    scale_bench,
    sched_bench,
    share_bench,
    soak_bench,
    spares_bench,
)
from tests.sigterm import interrupt_on_sigterm

DEFAULT = (
    plugin_bench,
    mig_bench,
    fabric_bench,
    sched_bench,
    share_bench,
    burst_bench,
    checkpoint_bench,
)
BY_NAME: dict[str, ModuleType] = {
    m.__name__.rsplit(".", 1)[-1].removesuffix("_bench"): m
    for m in (
        *DEFAULT,
        health_bench,
        idle_bench,
        soak_bench,
        scale_bench,
        spares_bench,
        mig_media,
        repeat_bench,
    )
}


def main(argv: list[str]) -> int:
    interrupt_on_sigterm()  # a bench stopped with SIGTERM tears down what it started
    if argv:
        bench = BY_NAME.get(argv[0])
        if bench is None:
            print(f"unknown benchmark {argv[0]!r}; one of: {', '.join(BY_NAME)}", file=sys.stderr)
            return 2
        bench.main(argv[1:])
        return 0
    for bench in DEFAULT:
        print(f"== {bench.__name__.rsplit('.', 1)[-1]}", flush=True)
        bench.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
