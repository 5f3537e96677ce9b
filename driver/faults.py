"""Named crash points for proving crash safety.

Setting ``PATCHBAY_CRASH_POINT=<name>`` makes the process kill itself with
SIGKILL when it reaches that point, exactly as an OOM kill or a crash would
stop it (what it wrote stays; power loss is a reboot, see docs/design.md).
Tests use it to crash the plugin at each step of a prepare and an unprepare,
and the controller at each step of an attach, and check that the next call
converges with nothing leaked (and nothing asked twice). The variable is read
once, when the process starts (tests set it in the environment of the
process they start): a point costs one comparison, where a lookup in
``os.environ`` cost a prepare 2-3 us each at four or five points.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "PATCHBAY_CRASH_POINT"

# The points, in the order a prepare reaches them.
PREPARE_POINTS = (
    "prepare-recorded",  # PrepareStarted is on disk, nothing done yet
    "prepare-device-done",  # the first device's handler finished
    "prepare-cdi-written",  # the CDI spec is on disk, state still PrepareStarted
    "prepare-completed",  # PrepareCompleted is on disk, answer not sent
)
# Inside the claim-wide GPU sharing step (driver.gpu.sharing.claims), MPS claims.
SHARING_POINTS = (
    "sharing-compute-mode-set",  # compute mode EXCLUSIVE_PROCESS set, no daemon yet
    "sharing-mps-started",  # the MPS daemon runs, the CDI spec not written
    "sharing-mps-stopped",  # unprepare stopped the daemon, compute mode not reset
)
# Inside the MPS supervisor's converge (driver.gpu.sharing.supervisor), or the
# plugin's without a supervisor.
MPS_POINTS = (
    "mps-daemon-started",  # the daemon runs, its daemon.json not written
    "mps-ready-unwritten",  # the daemon is configured, ready.json not written
    "mps-daemon-stopped",  # the daemon quit, its directory not removed
)
# Inside the controller's attach worker (driver.controller.attach.workers).
CONTROLLER_POINTS = (
    "fabric-attach-answered",  # the fabric answered the attach request, nothing recorded
    "fabric-attach-waiting",  # the operation handle is on the claim, its task runs
)
UNPREPARE_POINTS = (
    "unprepare-devices-undone",  # the handlers undid the devices, the record is still there
    "unprepare-recorded",  # the record is gone from disk, the CDI spec not yet
)


_ARMED = os.environ.get(ENV)  # the point this process dies at, if any


def crash_point(name: str) -> None:
    if name == _ARMED:
        log.critical("crash point %s reached: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)
