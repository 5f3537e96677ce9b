"""Move a PCI function between its kernel driver and ``vfio-pci``, and back.

Why this module exists: the rebinding sequence is the one place where a
mistake strands a device (unbound, or stuck on the wrong driver), so it is
written once, for SR-IOV VFs (``driver.vf``) and whole GPUs handed to a VM
(``driver.gpu.passthrough``) alike, waits for each step to show in the
``driver`` link, and is tested on the simulated tree. To vfio: set ``driver_override`` to
``vfio-pci``, unbind from the current driver, then bind (``vfio-pci/bind``
where the driver is loaded, else ``drivers_probe``, which honours the
override). Back: clear the override, unbind, bind the original driver.
"""

from __future__ import annotations

import logging
from pathlib import Path

from driver.errors import DeviceError
from driver.pci.writes import driver_of, wait_until, write_attr, write_command

log = logging.getLogger(__name__)

VFIO_PCI = "vfio-pci"


def read_override(device_path: Path) -> str | None:
    try:
        value = (device_path / "driver_override").read_text().strip()
    except OSError:
        return None
    return None if value in ("", "(null)") else value


def _unbind(drivers: Path, bdf: str, device_path: Path, timeout: float) -> None:
    current = driver_of(device_path)
    if current is None:
        return
    write_command(drivers / current / "unbind", bdf)
    wait_until(f"{bdf} to unbind from {current}", lambda: driver_of(device_path) is None, timeout)


def _bind(sysfs_root: Path, bdf: str, device_path: Path, driver: str, timeout: float) -> None:
    pci = sysfs_root / "bus" / "pci"
    bind = pci / "drivers" / driver / "bind"
    write_command(bind if bind.exists() else pci / "drivers_probe", bdf)
    wait_until(
        f"{bdf} to bind to {driver} (is the module loaded?)",
        lambda: driver_of(device_path) == driver,
        timeout,
    )


def bind_vfio(sysfs_root: Path, bdf: str, device_path: Path, timeout: float) -> None:
    """Bind the function to ``vfio-pci`` (a no-op when it already is)."""
    if driver_of(device_path) == VFIO_PCI:
        return
    log.info("binding %s to %s (was %s)", bdf, VFIO_PCI, driver_of(device_path))
    write_attr(device_path / "driver_override", VFIO_PCI)
    _unbind(sysfs_root / "bus" / "pci" / "drivers", bdf, device_path, timeout)
    _bind(sysfs_root, bdf, device_path, VFIO_PCI, timeout)


def restore(
    sysfs_root: Path, bdf: str, device_path: Path, original: str | None, timeout: float
) -> None:
    """Put the function back on ``original`` (None: leave it unbound); idempotent."""
    if read_override(device_path) is not None:
        write_attr(device_path / "driver_override", "\n")
    current = driver_of(device_path)
    if current == original:
        return
    log.info("restoring %s from %s to %s", bdf, current, original)
    _unbind(sysfs_root / "bus" / "pci" / "drivers", bdf, device_path, timeout)
    if original is not None:
        _bind(sysfs_root, bdf, device_path, original, timeout)
    if driver_of(device_path) != original:
        raise DeviceError(f"{bdf} is on {driver_of(device_path)}, expected {original}")
