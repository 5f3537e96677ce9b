"""The device nodes a container needs to drive a function bound to ``vfio-pci``.

Why this module exists: a VF in vfio mode (``driver.vf``) and a whole GPU in
passthrough (``driver.gpu.passthrough``) hand the container the same two
nodes, ``/dev/vfio/vfio`` (the container, misc 10:196) and
``/dev/vfio/<group>`` (the device's IOMMU group), so their numbers and the
rule for finding them live here once. Numbers come from the node's ``/dev``
when the node exists there (``--dev-root``); a simulated host has no vfio
nodes, so the spec then carries fixed numbers (group nodes get a dynamic
major on a real kernel; 511 stands in for it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from driver.cdi import DeviceNode

MISC_MAJOR = 10
VFIO_CONTAINER_MINOR = 196
VFIO_GROUP_FALLBACK_MAJOR = 511


def char_node(dev_root: Path, name: str, default_major: int, default_minor: int) -> DeviceNode:
    """``/dev/<name>`` with the numbers of the node in ``dev_root``, else the defaults."""
    host = dev_root / name
    try:
        st = host.stat()
    except OSError:
        return DeviceNode(path=f"/dev/{name}", major=default_major, minor=default_minor)
    if not stat.S_ISCHR(st.st_mode):
        return DeviceNode(path=f"/dev/{name}", major=default_major, minor=default_minor)
    return DeviceNode(
        path=f"/dev/{name}",
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        host_path=str(host),
    )


def vfio_nodes(dev_root: Path, group: str) -> tuple[DeviceNode, DeviceNode]:
    """The IOMMU group's node and the vfio container node, in that order."""
    return (
        char_node(dev_root, f"vfio/{group}", VFIO_GROUP_FALLBACK_MAJOR, int(group)),
        char_node(dev_root, "vfio/vfio", MISC_MAJOR, VFIO_CONTAINER_MINOR),
    )
