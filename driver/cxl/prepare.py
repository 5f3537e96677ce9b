"""Prepare CXL memory for a container: its devdax character device.

Why this module exists: it is the CXL memory family's
:class:`driver.devices.handler.DeviceHandler`. The container gets
``/dev/daxR.0``, which it maps (``mmap``) to use the memory directly, and
claim-wide environment: ``PATCHBAY_CXL_DEVICES`` lists the paths of every
CXL device of the claim, and for item ``i`` of that list
``PATCHBAY_CXL_SIZE_<i>`` (bytes), ``PATCHBAY_CXL_NUMA_NODE_<i>`` (the
memory-only node the memory belongs to) and ``PATCHBAY_CXL_SERIAL_<i>``.
Nothing on the host changes. An admin-access view (``driver.claims.admin``)
gets the environment alone, never the device node: mapping it would reach
the holder's memory. Prepare refuses a device that is no longer in
devdax mode (``kmem`` took it as system RAM) or is another device than the
one published (serial).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from driver.cdi import ContainerEdits
from driver.config.opaque import DeviceConfig
from driver.cxl import KIND
from driver.cxl.discovery import memory_at
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.devices.nodes import cdi_node
from driver.errors import DeviceError

DEVICES_ENV = "PATCHBAY_CXL_DEVICES"


class CxlMemoryHandler:
    """Prepares ``cxlmem`` devices: CDI edits only."""

    kind = KIND
    has_side_effects = False
    blocking = True  # reads sysfs

    def __init__(self, sysfs_root: Path, dev_root: Path) -> None:
        self._sysfs = sysfs_root
        self._dev = dev_root

    def plan_undo(self, device: Device, config: DeviceConfig | None = None) -> dict[str, Any]:
        return {}

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        bdf = device.local_id
        memory = memory_at(self._sysfs, bdf)
        if memory is None:
            raise DeviceError(
                f"CXL memory {device.name} ({bdf}) has no devdax device now "
                "(removed, or onlined as system RAM)"
            )
        want = device.attributes.get("serial")
        if want and memory.serial != want:
            raise DeviceError(
                f"CXL memory {device.name} ({bdf}) has serial {memory.serial}, "
                f"published as {want}: a different device, not prepared"
            )
        path = f"/dev/{memory.dax.name}"
        node = cdi_node(self._dev, memory.dax, "c")
        return Preparation(
            edits=ContainerEdits(device_nodes=(node,)),
            claim_lists=((DEVICES_ENV, path),),
            indexed_env=(
                ("PATCHBAY_CXL_SIZE", str(memory.size)),
                ("PATCHBAY_CXL_NUMA_NODE", str(memory.target_node)),
                ("PATCHBAY_CXL_SERIAL", memory.serial),
            ),
        )

    def prepare_admin(self, device: Device, holder: Mapping[str, Any] | None) -> Preparation:
        memory = memory_at(self._sysfs, device.local_id)
        if memory is None:
            raise DeviceError(f"CXL memory {device.name} ({device.local_id}) is gone")
        return Preparation(
            edits=ContainerEdits(),
            claim_lists=(("PATCHBAY_CXL_ADMIN_DEVICES", f"/dev/{memory.dax.name}"),),
            indexed_env=(
                ("PATCHBAY_CXL_ADMIN_SIZE", str(memory.size)),
                ("PATCHBAY_CXL_ADMIN_NUMA_NODE", str(memory.target_node)),
                ("PATCHBAY_CXL_ADMIN_SERIAL", memory.serial),
            ),
        )

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        return None  # nothing changed on the host; the claim's CDI spec goes with it

    def common_edits(self) -> ContainerEdits | None:
        return None
