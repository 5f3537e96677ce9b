"""Writing sysfs control files and waiting for the kernel to act on them.

Why this module exists: creating VFs and rebinding drivers are both "write a
file, then watch another file change". On a real kernel the change has
happened when the write returns; on a simulated host a separate effects step
applies it a few milliseconds later. Waiting for the observable result
serves both (for VFs and for GPU passthrough), and a change that never
comes becomes a clear error instead of a half-prepared device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from driver.errors import DeviceError

log = logging.getLogger(__name__)

POLL_SECONDS = 0.01


def write_attr(path: Path, value: str) -> None:
    """Write one value to a sysfs control file (no truncating temp files)."""
    try:
        with path.open("w") as f:
            f.write(value)
    except OSError as exc:
        raise DeviceError(f"cannot write {value!r} to {path}: {exc}") from exc
    log.debug("wrote %r to %s", value, path)


def write_command(path: Path, bdf: str) -> None:
    """Write one request to a sysfs command file (``bind``, ``unbind``,
    ``drivers_probe``), as ``echo BDF >> FILE`` does: appended, with a
    newline. The kernel acts on each write as it comes, so appending is the
    same to it; a simulated tree (``fabric/simhost/effects.py``) sees every
    request of writers that write at once. Truncating writes lost one of two
    VFs of one PF rebinding side by side, which per-device prepare locks let
    happen (issue 36: a burst's VF claim timed out waiting for its unbind)."""
    try:
        with path.open("a") as f:
            f.write(bdf + "\n")
    except OSError as exc:
        raise DeviceError(f"cannot write {bdf!r} to {path}: {exc}") from exc
    log.debug("wrote %r to %s", bdf, path)


def wait_until(what: str, done: Callable[[], bool], timeout: float) -> None:
    """Poll ``done`` until true; :class:`DeviceError` naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            raise DeviceError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(POLL_SECONDS)


def link_name(link: Path) -> str | None:
    """The last name of ``link``'s target; None when there is no link (now).

    One ``readlink``: the kernel removes a ``driver`` link while unbinding,
    between any two calls, so "is it a link?" then "where to?" (or
    ``realpath``, which lstats every component and then reads the link)
    raised when it went in between (issue 33: a passthrough unbind polled
    into it). Gone is an answer: none."""
    try:
        return link.readlink().name
    except OSError:  # not there (now), or not a link
        return None


def driver_of(device_path: Path) -> str | None:
    """The name of the driver bound to a device, None when unbound."""
    return link_name(device_path / "driver")


def iommu_group(device_path: Path) -> str | None:
    return link_name(device_path / "iommu_group")
