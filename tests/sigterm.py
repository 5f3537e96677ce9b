"""A run told to stop with SIGTERM tears down what it started.

Why this module exists: the harness starts processes (plugins, the simulated
fabric, control planes), network namespaces and mounts, and undoes them in
fixture teardowns. Python's default SIGTERM ends the process at once, with no
``finally`` and no teardown, so a run stopped by ``timeout``, a CI job's
cancel or a user's ``kill`` left plugin and fabric processes running under
pid 1 (seen by a helper session). A SIGTERM now interrupts the run as Ctrl-C
does: pytest ends the session and its teardowns run. A second SIGTERM ends it
at once (the default), for a teardown that hangs.

Registered for every tier by ``tests/conftest.py``; each pytest process (an
xdist worker too) installs it for itself.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the process
    raise KeyboardInterrupt("SIGTERM: ending the run; tearing down what it started")


def interrupt_on_sigterm() -> None:
    """From now on a SIGTERM ends this process as Ctrl-C does (the
    benches' entry point, ``tests.bench``, calls it too: a bench stopped
    so left its plugins and the reference's running)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    interrupt_on_sigterm()
