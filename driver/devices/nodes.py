"""Device nodes as sysfs describes them and as a CDI spec hands them over.

Why this module exists: NVMe namespaces and CXL dax devices reach a
container as device nodes whose numbers the kernel publishes in each sysfs
device's ``dev`` attribute (``major:minor``, what udev reads to make the node
in ``/dev``). Reading them from sysfs at prepare time works on a host whose
``/dev`` the plugin cannot see (and on a simulated host); the host path goes
into the CDI spec only where ``--dev-root`` has a node of the right type.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass
from pathlib import Path

from driver.cdi import DeviceNode

_DEV = re.compile(r"^(\d+):(\d+)$")


@dataclass(frozen=True)
class DevNode:
    """``/dev/<name>`` with its numbers, as sysfs names them."""

    name: str
    major: int
    minor: int


def dev_node(path: Path) -> DevNode | None:
    """The node of the sysfs device at ``path`` (its ``dev`` attribute); None without one."""
    try:
        match = _DEV.match((path / "dev").read_text().strip())
    except (OSError, ValueError):
        return None
    return DevNode(path.name, int(match[1]), int(match[2])) if match else None


def cdi_node(dev_root: Path, node: DevNode, kind: str) -> DeviceNode:
    """The CDI entry of a ``c`` (character) or ``b`` (block) node: numbers from
    sysfs, the host path when ``dev_root`` has such a node of that name."""
    host = dev_root / node.name
    try:
        mode = host.stat().st_mode
    except OSError:
        mode = 0
    is_node = stat.S_ISBLK(mode) if kind == "b" else stat.S_ISCHR(mode)
    return DeviceNode(
        path=f"/dev/{node.name}",
        major=node.major,
        minor=node.minor,
        type=kind,
        host_path=str(host) if is_node else None,
    )
