"""Every contract scenario by name: what the runner and the contract test run.

Why a module: the scenarios live in modules by subject
(``tests.contract.scenarios``, ``tests.contract.scenarios_health``); this
is the one list of them.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.contract.scenarios import (
    compute_modes,
    enumeration,
    events,
    failure_injection,
    hot_add,
    lookup_by_uuid,
    mig_cycle,
    mode_semantics,
    occupied_placement,
    persistence,
    removed_lost,
    two_step_mig,
)
from tests.contract.scenarios_health import condition, running_processes
from tests.contract.scenarios_utilization import (
    process_utilization,
    shares_by_process,
    utilization,
)
from tests.contract.world import World

SCENARIOS: dict[str, Callable[[World], None]] = {
    f.__name__: f
    for f in (
        enumeration,
        mig_cycle,
        two_step_mig,
        mode_semantics,
        compute_modes,
        running_processes,
        occupied_placement,
        persistence,
        failure_injection,
        lookup_by_uuid,
        hot_add,
        removed_lost,
        events,
        condition,
        utilization,
        process_utilization,
        shares_by_process,
    )
}
