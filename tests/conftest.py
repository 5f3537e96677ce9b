"""Fixtures shared by every tier. The cluster fixtures live in one plugin
module so the integration and e2e tiers share ONE control plane per run."""

from typing import Any

from tests import figures

pytest_plugins = ["tests.cluster_fixtures"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in figures.lines():
        terminalreporter.write_line(line)
