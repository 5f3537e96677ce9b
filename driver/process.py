"""What every patchbay process does around its main coroutine.

Parse the process's settings (flags and env vars), configure logging, run
the coroutine on one asyncio loop (uvloop's: its TLS and socket paths cut
the plugin's CPU per prepare+unprepare pair by 8-11 % in ``make bench``,
for 1.7 MB of RSS), and turn our own errors into exit codes
with one log line: 2 for bad settings, and for an error that ends the run
the code its class carries (the table is the tree in ``driver.errors``: 2
configuration, 3 discovery or hot-plug, 4 Kubernetes API, 5 leader lease
lost, 1 any other). A vital task that fails ends its supervising task group
with an ``ExceptionGroup``; the code comes from the errors inside it, not
from the group. Anything that is not one of our errors (a bug) keeps its
traceback. SIGUSR2 logs a heap summary (``driver.heapsummary``). Shared by
``patchbay-plugin``, ``patchbay-mps-supervisor``, ``patchbay-controller`` and
``patchbay-fabric`` so the four daemons behave alike (``kubectl-patchbay``
is a CLI, not a daemon).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

import uvloop
from pydantic import BaseModel, Field

from driver import heapsummary
from driver.errors import PatchbayError, leaves
from driver.logconfig import configure
from driver.settingsflags import parse_settings

log = logging.getLogger(__name__)


class ProcessSettings(BaseModel):
    """Settings every process has."""

    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level name"
    )
    log_format: Literal["text", "json"] = Field(default="text", description="log output format")


S = TypeVar("S", bound=ProcessSettings)


def run_process(
    model: type[S],
    run: Callable[[S], Awaitable[None]],
    prog: str,
    argv: Sequence[str] | None = None,
) -> int:
    """The exit code of running ``run`` with settings parsed into ``model``."""
    try:
        settings = parse_settings(model, argv, prog=prog)
    except PatchbayError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)

    async def main() -> None:
        heapsummary.install(asyncio.get_running_loop())  # SIGUSR2: driver.heapsummary
        await run(settings)

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    except (PatchbayError, ExceptionGroup) as exc:
        status = exit_status(exc)
        if status is None:
            raise
        code, line = status
        if code:
            log.error("exiting with status %d: %s", code, line)
        else:
            log.info("stopped: %s", line)
        return code
    return 0


def exit_status(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one log line for ``exc``, one of our errors or a
    task group's group of them; None when anything inside is not ours.

    The first error with a non-zero code decides (errors that ended a task
    group at the same moment are named on the same line).
    """
    errors = leaves(exc)
    ours = [e for e in errors if isinstance(e, PatchbayError)]
    if len(ours) != len(errors) or not ours:
        return None
    code = next((e.exit_code for e in ours if e.exit_code), 0)
    return code, "; ".join(f"{type(e).__name__}: {e}" for e in ours)
