"""The plugin's side of the MPS hand-off: what daemon a claim wants, and its answer.

Why it exists: a process lives as long as its container, so an MPS daemon
the plugin started dies when a rolling update replaces the plugin pod. With
``--mps-supervisor`` the daemons are run by ``patchbay-mps-supervisor``, a
pod of its own on the node (``updateStrategy: OnDelete``: a plugin update
never touches it), and the two share nothing but the host directory
``--mps-root``. The hand-off is declarative, each file written atomically,
so either side may be killed at any step:

- ``<mps-root>/<claim uid>/want.json`` (the plugin): the claim's GPUs,
  thread percentage and pinned memory limits, and a fresh ``request`` id per
  prepare;
- ``ready.json`` beside it (the supervisor): that ``request`` id with the
  daemon's pid and start time, or the ``error`` that stopped it;
- no ``want.json``: the supervisor stops the daemon and removes the claim's
  directory; unprepare waits for the directory to be gone.

Without the supervisor the plugin converges the directory itself, with
the same code (:func:`driver.gpu.sharing.supervisor.converge`), right after
writing the want: one code path, the only difference who runs it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from driver.atomicfile import write_atomic
from driver.errors import DeviceError
from driver.gpu.sharing.mps import MpsDaemons
from driver.gpu.sharing.supervisor import READY_FILE, WANT_FILE, converge, read_json

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0  # how long prepare waits for the ready mark, unprepare for the removal
_POLL_S = 0.05


class MpsHandoff:
    """What :class:`driver.gpu.sharing.claims.GpuSharing` asks of MPS."""

    def __init__(
        self, daemons: MpsDaemons, *, supervised: bool, timeout: float = TIMEOUT_S
    ) -> None:
        self.daemons = daemons
        self.supervised = supervised
        self.timeout = timeout

    def directory(self, claim_uid: str) -> Path:
        return self.daemons.directory(claim_uid)

    def dirs(self, directory: Path) -> tuple[Path, Path]:
        return self.daemons.dirs(directory)

    def running(self, directory: Path) -> int | None:
        return self.daemons.running(directory)

    def ensure(
        self,
        directory: Path,
        uuids: Sequence[str],
        threads: int | None,
        pinned_mib: Mapping[str, int],
    ) -> int:
        """Want the claim's daemon; its pid once it serves, configured."""
        want: dict[str, Any] = {"request": uuid.uuid4().hex, "uuids": list(uuids)}
        want.update(threads=threads, pinned_mib=dict(pinned_mib))
        data = json.dumps(want).encode()
        _write(directory, data)
        if not self.supervised:
            converge(self.daemons, directory)
        deadline = time.monotonic() + self.timeout
        while True:
            ready = read_json(directory / READY_FILE)
            if ready is not None and ready.get("request") == want["request"]:
                break
            if time.monotonic() > deadline:
                raise DeviceError(
                    f"MPS daemon of claim {directory.name}: no ready mark from the MPS "
                    f"supervisor within {self.timeout:.0f} s (is patchbay-mps-supervisor "
                    f"running on this node, with --mps-root {self.daemons.root}?)"
                )
            if not (directory / WANT_FILE).exists():  # removed with a directory being cleaned
                _write(directory, data)
            time.sleep(_POLL_S)
        if ready.get("error"):
            raise DeviceError(f"MPS daemon of claim {directory.name}: {ready['error']}")
        return int(ready["pid"])

    def stop(self, directory: Path) -> None:
        """Want the claim's daemon gone; returns once its directory is."""
        (directory / WANT_FILE).unlink(missing_ok=True)
        if not self.supervised:
            converge(self.daemons, directory, wait_for_want=False)
        deadline = time.monotonic() + self.timeout
        while directory.exists():
            if time.monotonic() > deadline:
                raise DeviceError(
                    f"MPS daemon of claim {directory.name}: the MPS supervisor did not stop "
                    f"it and remove {directory} within {self.timeout:.0f} s"
                )
            time.sleep(_POLL_S)


def _write(directory: Path, data: bytes) -> None:
    """``want.json``, atomically (the supervisor may be removing the directory)."""
    for _ in range(20):
        directory.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(directory / WANT_FILE, data)
            return
        except FileNotFoundError:
            time.sleep(_POLL_S)
    raise DeviceError(f"cannot write {directory / WANT_FILE}: the directory keeps vanishing")
