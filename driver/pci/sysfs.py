"""Where a PCI device sits, read from a sysfs tree.

``bus/pci/devices/<bdf>`` is a symlink into ``devices/``; the first path
element below ``devices/`` names the root complex (``pci0000:3a``), which is
what ``resource.kubernetes.io/pcieRoot`` carries. We never derive it from the
bus id: a device behind a switch has a different bus number than its root.
The functions take the sysfs root so tests and simulated hosts can point
them at a directory of their own.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _device_link(sysfs_root: Path, bdf: str) -> Path:
    bdf = bdf.lower()
    if not _BDF.match(bdf):
        raise ValueError(f"not a PCI address: {bdf!r}")
    return sysfs_root / "bus" / "pci" / "devices" / bdf


def device_path(sysfs_root: Path, bdf: str) -> Path:
    """The device's real directory under ``<root>/devices`` (symlink resolved)."""
    link = _device_link(sysfs_root, bdf)
    target = Path(os.path.realpath(link))
    if not target.is_dir():
        raise FileNotFoundError(f"{link} does not resolve to a device directory")
    return target


def pcie_root(sysfs_root: Path, bdf: str) -> str:
    """The root complex of ``bdf``, e.g. ``pci0000:3a``."""
    devices = Path(os.path.realpath(sysfs_root / "devices"))
    rel = device_path(sysfs_root, bdf).relative_to(devices)
    root = rel.parts[0]
    if not root.startswith("pci"):
        raise ValueError(f"{bdf} is not below a PCI root complex: {rel}")
    return root


def numa_node(sysfs_root: Path, bdf: str) -> int | None:
    """The device's NUMA node, or None where the kernel reports -1 / no file
    (or the file holds something else: logged, naming it)."""
    path = device_path(sysfs_root, bdf) / "numa_node"
    try:
        raw = path.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # not a file, not UTF-8
        log.warning("cannot read %s: %s; NUMA node omitted", path, exc)
        return None
    if raw == "-1":
        return None
    if not (raw.isascii() and raw.isdigit()):
        log.warning("%s holds %r, not a NUMA node; omitted", path, raw)
        return None
    return int(raw)
