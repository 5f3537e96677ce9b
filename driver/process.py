"""What every patchbay process does around its main coroutine.

Parse the process's settings (flags and env vars), configure logging, run
the coroutine on one asyncio loop, and turn our own errors into exit codes:
2 for bad settings, 1 for a deliberate failure. Shared by
``patchbay-plugin``, ``patchbay-controller`` and ``patchbay-fabric`` so the
three binaries behave alike.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel, Field

from driver.errors import PatchbayError
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
    try:
        asyncio.run(run(settings))  # type: ignore[arg-type]
    except PatchbayError as exc:
        log.error("%s", exc)
        return 1
    return 0
