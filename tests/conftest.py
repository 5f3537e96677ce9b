"""Fixtures shared by every tier. The cluster fixtures live in one plugin
module so the integration and e2e tests of one pytest process share ONE
control plane.

Under pytest-xdist (the cluster tiers run with ``-n``: Makefile) each worker
is such a process with a control plane of its own. Figures reported in a
worker (``tests.figures``) travel to the controller in ``workeroutput`` and
are printed in the run's one summary, with the machine's CPU use over the
run (``tests.machine_load``), by which the number of workers is chosen.
"""

from typing import Any

import pytest

from tests import figures, machine_load

# run_dirs first: cluster_fixtures imports it, and a plugin imported before
# its turn is not rewritten by pytest (a warning on every run).
pytest_plugins = ["tests.run_dirs", "tests.cluster_fixtures", "tests.sigterm"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller, or a plain run
        machine_load.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker: hand the figures to the controller
        output["figures"] = figures.lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(pytest-xdist) a worker ended: keep the figures it reported."""
    for line in getattr(node, "workeroutput", {}).get("figures", []):
        figures.keep(line)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in figures.lines():
        terminalreporter.write_line(line)
    workers = terminalreporter.config.getoption("numprocesses", default=None) or 1
    load = machine_load.summary(int(workers))
    if load:
        terminalreporter.write_line(load)
