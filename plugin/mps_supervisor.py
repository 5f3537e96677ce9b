"""Entry point of ``patchbay-mps-supervisor``: the node's MPS control daemons.

Why it exists: a process lives as long as its container, so MPS daemons the
plugin started would die with a rolling update of the plugin DaemonSet. This
process runs them instead, in a pod of its own (the chart's MPS supervisor
DaemonSet, ``updateStrategy: OnDelete``), reconciling ``--mps-root`` to what
the plugin's want files say (``driver.gpu.sharing.supervisor``). Its MPS
settings are the plugin's own (``driver.gpu.sharing.settings``). It needs no
API access and no NVML: compute modes stay the plugin's.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Sequence

from pydantic import ConfigDict

from driver.gpu.sharing.mps import MpsDaemons
from driver.gpu.sharing.settings import MpsSettings
from driver.gpu.sharing.supervisor import MpsSupervisor
from driver.process import ProcessSettings, run_process

log = logging.getLogger(__name__)


class MpsSupervisorSettings(ProcessSettings, MpsSettings):
    """patchbay MPS supervisor: runs the MPS daemons the node plugin wants."""

    model_config = ConfigDict(extra="forbid", frozen=True)


async def _run(settings: MpsSupervisorSettings) -> None:
    supervisor = MpsSupervisor(MpsDaemons(settings.mps_control_path, settings.mps_root))
    stop = threading.Event()
    try:
        await asyncio.to_thread(supervisor.run, stop)
    finally:
        stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    return run_process(MpsSupervisorSettings, _run, "patchbay-mps-supervisor", argv)


if __name__ == "__main__":
    sys.exit(main())
