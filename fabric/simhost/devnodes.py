"""Device numbers and ``/dev`` nodes of a simulated host.

Why this module exists: a block or character device shows up twice on a
Linux host, as a ``dev`` attribute (``major:minor``) in sysfs and as a node
in ``/dev``. The simulated host writes both, under its own sysfs root and
its own dev root (``<host dir>/dev``, the plugin's ``--dev-root``), so the
driver reads device numbers the way udev does and finds the node where a
container runtime would. Real nodes are made with ``mknod`` where the
process may (root with ``CAP_MKNOD``); elsewhere a plain file stands in, and
the driver then takes the numbers from sysfs alone.

Majors are taken from the ranges Linux reserves for local/experimental use
(60-63 and 120-127 in the kernel's ``devices.txt``), never what a kernel
hands real NVMe or DAX devices (259, dynamic majors): the simulated host runs
on a real machine, and a container handed a simulated node on the real-node
tier must never reach one of that machine's disks. The driver takes the
numbers from sysfs, so nothing depends on which they are.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

NVME_BLOCK_MAJOR = 120  # a real kernel's: 259 (BLOCK_EXT_MAJOR)
NVME_CHAR_MAJOR = 121
NVME_GENERIC_MAJOR = 122
DAX_MAJOR = 123
CXL_MEM_MAJOR = 124


def used_minors(sysfs_root: Path, pattern: str, major: int) -> set[int]:
    """The minors of ``major`` already given to the ``dev`` files matching ``pattern``."""
    out = set()
    for dev in sysfs_root.glob(pattern):
        try:
            got_major, minor = (int(x) for x in dev.read_text().strip().split(":"))
        except (OSError, ValueError):
            continue
        if got_major == major:
            out.add(minor)
    return out


def lowest_free(used: set[int]) -> int:
    """The smallest number not in ``used`` (what the kernel's ida hands out)."""
    n = 0
    while n in used:
        n += 1
    return n


def make_node(dev_root: Path, name: str, kind: str, major: int, minor: int) -> Path:
    """Create ``<dev_root>/<name>``, a ``c`` or ``b`` node (or a stand-in file)."""
    path = dev_root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    mode = 0o600 | (stat.S_IFCHR if kind == "c" else stat.S_IFBLK)
    try:
        os.mknod(path, mode, os.makedev(major, minor))
    except OSError as exc:  # no CAP_MKNOD: a plain file marks where the node would be
        log.debug("mknod %s refused (%s); a plain file stands in", path, exc)
        path.write_text("")
    return path


def remove_node(dev_root: Path, name: str) -> None:
    (dev_root / name).unlink(missing_ok=True)
