"""Waiting until the cluster shows something: the harness's one poll loop.

Why a module: tests, the demo and the docs' picture generator all wait for
things a cluster does eventually (a pod Running, a spare attached, a
ServiceAccount made). Each used to carry its own deadline loop, with its
own idea of when a value counts as "there" and of what a timeout raises.
Here there is one loop on the monotonic clock: :func:`until` gives up
quietly (the caller reports what it saw), :func:`wait_for` fails with
:class:`WaitTimedOut` naming what it waited for. A tier that needs its own
way to fail (a launcher's clean exit) catches that one exception.

A wait ends when the probe's answer is done (truthy by default; ``done``
says otherwise, e.g. ``is not None`` for a probe whose answer may be 0),
bounded by its timeout; the interval between probes only sets how soon
after the change the wait notices it, never what is asserted. A probe is
called with no arguments (typed ``Callable[..., Any]`` so that a lambda may
bind a loop's value as a default argument).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class WaitTimedOut(AssertionError):
    """A wait's condition did not hold within its timeout (a test failure)."""


def _poll(
    probe: Callable[..., Any], timeout: float, interval: float, done: Callable[[Any], bool]
) -> tuple[bool, Any]:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return True, value
        if time.monotonic() > deadline:
            return False, value
        time.sleep(interval)


def until(
    probe: Callable[..., Any],
    timeout: float,
    interval: float = 0.5,
    done: Callable[[Any], bool] = bool,
) -> Any:
    """``probe()``'s first done answer, or None once ``timeout`` passed."""
    held, value = _poll(probe, timeout, interval, done)
    return value if held else None


def wait_for(
    what: str,
    probe: Callable[..., Any],
    timeout: float = 60.0,
    interval: float = 0.5,
    done: Callable[[Any], bool] = bool,
) -> Any:
    """``probe()``'s first done answer; :class:`WaitTimedOut` naming ``what``
    after ``timeout``."""
    held, value = _poll(probe, timeout, interval, done)
    if not held:
        raise WaitTimedOut(f"timed out after {timeout:.0f}s waiting for {what}")
    return value
