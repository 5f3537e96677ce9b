"""The MPS supervisor's side of the hand-off: make each claim directory what it wants.

Why it exists: ``patchbay-mps-supervisor`` (``plugin/mps_supervisor.py``)
runs the node's MPS control daemons in a pod of its own, so that a rolling
update of the plugin leaves them serving running pods; the plugin says what
it wants through files in ``--mps-root`` (``driver.gpu.sharing.handoff``).
:func:`converge` is one idempotent step for one claim directory, and the
same function runs inside the plugin when there is no supervisor:

- ``want.json`` present: adopt the claim's running daemon or start it
  (``MpsDaemons.ensure``: pid and start time in ``daemon.json``, so a
  reused pid is never taken for it), configure it, then write
  ``ready.json`` with the want's ``request`` id (or the error). A daemon
  that died is started again with the same directories.
- ``want.json`` absent: quit the daemon (killed if it stays) and remove the
  directory.

Every file is written atomically and every step is safe to repeat, so a
supervisor killed anywhere converges on its next pass (crash points
``mps-daemon-started``, ``mps-ready-unwritten``, ``mps-daemon-stopped``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from driver.atomicfile import write_atomic
from driver.errors import DeviceError
from driver.faults import crash_point
from driver.gpu.sharing.mps import MpsDaemons, start_time

log = logging.getLogger(__name__)

WANT_FILE = "want.json"
READY_FILE = "ready.json"
POLL_S = 0.2  # a pass over the claim directories
NEW_CLAIM_GRACE_S = 10.0  # an empty claim directory younger than this awaits its want


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file; None when it is missing or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def converge(daemons: MpsDaemons, directory: Path, *, wait_for_want: bool = True) -> None:
    """One step towards what ``directory`` wants (``wait_for_want``: leave a
    just-made empty one to the writer that made it; the plugin converging on
    its own, with no one else writing, passes False)."""
    want = read_json(directory / WANT_FILE)
    if want is None:
        if (directory / WANT_FILE).exists():
            log.warning("%s is not a JSON object: left alone", directory / WANT_FILE)
            return
        if wait_for_want and _just_made(directory):
            return  # the plugin made it and is writing its want.json
        daemons.stop(directory)
        return
    ready = read_json(directory / READY_FILE)
    if ready is not None and ready.get("request") == want.get("request"):
        if ready.get("error") or daemons.running(directory) == ready.get("pid"):
            return  # answered; the daemon (if any) still runs
        log.warning("MPS daemon of %s is gone: starting it again", directory.name)
    state: dict[str, Any] = {"request": want.get("request")}
    try:
        uuids, threads, pinned = _parse(want)
        pid = daemons.ensure(directory, uuids, threads, pinned)
        state.update(pid=pid, start_time=start_time(pid))
    except DeviceError as exc:
        log.error("MPS daemon of %s: %s", directory.name, exc)
        state["error"] = str(exc)
    crash_point("mps-ready-unwritten")
    write_atomic(directory / READY_FILE, json.dumps(state).encode())


def _just_made(directory: Path) -> bool:
    """An empty directory (bar temp files, or a want.json that landed since it
    was read) younger than the grace: the plugin makes the directory, then
    writes its want into it; a pass in between must not take it for a claim
    that went (removing it would lose the want). Older, it is what a plugin
    that died in between left: removed."""
    try:
        young = time.time() - directory.stat().st_mtime < NEW_CLAIM_GRACE_S
        # want.json may have landed since it was read: the next pass reads it.
        return young and all(e.name.startswith(".") or e.name == WANT_FILE
                             for e in directory.iterdir())  # fmt: skip
    except FileNotFoundError:
        return False


def _parse(want: dict[str, Any]) -> tuple[list[str], int | None, dict[str, int]]:
    """(GPUs, thread percentage, pinned MiB per GPU) of a want; DeviceError if malformed."""
    try:
        uuids = [str(u) for u in want["uuids"]]
        threads = None if want.get("threads") is None else int(want["threads"])
        pinned = {str(k): int(v) for k, v in (want.get("pinned_mib") or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DeviceError(f"malformed {WANT_FILE}: {exc!r}") from exc
    return uuids, threads, pinned


class MpsSupervisor:
    """Passes :func:`converge` over every claim directory of ``--mps-root``."""

    def __init__(self, daemons: MpsDaemons, poll: float = POLL_S) -> None:
        self.daemons = daemons
        self.poll = poll

    def pass_once(self) -> None:
        _reap()
        try:
            entries = sorted(self.daemons.root.iterdir())
        except FileNotFoundError:
            return
        for directory in entries:
            if directory.name.startswith(".") or not directory.is_dir():
                continue
            try:
                converge(self.daemons, directory)
            except (DeviceError, OSError) as exc:  # one claim's trouble stops no other
                log.error("MPS claim directory %s: %s", directory, exc)

    def run(self, stop: threading.Event) -> None:
        self.daemons.root.mkdir(parents=True, exist_ok=True)
        log.info("MPS supervisor serving %s (%s)", self.daemons.root, self.daemons.control)
        while True:
            self.pass_once()
            if stop.wait(self.poll):
                return


def _reap() -> None:
    """Reap daemons that quit: as a container's PID 1 the supervisor inherits
    them (they double-fork); between passes no subprocess of ours is running.
    Elsewhere they are init's (or a subreaper's), and our children not ours to reap."""
    if os.getpid() != 1:
        return
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
