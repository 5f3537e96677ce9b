"""Prepare an NVMe drive for a container: its namespaces' block and generic devices.

Why this module exists: it is the NVMe family's
:class:`driver.devices.handler.DeviceHandler`. Nothing on the host changes;
the container gets, per namespace, the block device ``/dev/nvmeXnY`` (for a
file system or raw I/O) and the generic character device ``/dev/ngXnY``
(io_uring passthrough), never the controller's ``/dev/nvmeX`` (admin
commands: format, firmware). Device numbers come from sysfs at prepare time,
and the drive must still carry the serial it was published with: a drive
swapped between publish and prepare is refused, not handed out. The
environment names the paths, claim-wide (a per-device variable would be
overridden by the claim's next device): ``PATCHBAY_NVME_DEVICES`` (the block
devices of every drive of the claim, comma-separated) and
``PATCHBAY_NVME_GENERIC_DEVICES``; ``PATCHBAY_NVME_SERIAL_<i>`` and
``PATCHBAY_NVME_PCI_BUS_ID_<i>`` describe the drive whose first namespace is
item ``i`` of ``PATCHBAY_NVME_DEVICES``. An admin-access view
(``driver.claims.admin``) gets the controller's ``/dev/nvmeX`` instead, for
health and SMART logs, and no namespace: it never touches the holder's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from driver.cdi import ContainerEdits, DeviceNode
from driver.config.opaque import DeviceConfig
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.devices.nodes import cdi_node
from driver.errors import DeviceError
from driver.nvme import KIND
from driver.nvme.discovery import controller_at

DEVICES_ENV = "PATCHBAY_NVME_DEVICES"
GENERIC_ENV = "PATCHBAY_NVME_GENERIC_DEVICES"


class NvmeHandler:
    """Prepares ``nvme`` devices: CDI edits only."""

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
        ctrl = controller_at(self._sysfs, bdf)
        if ctrl is None:
            raise DeviceError(f"NVMe drive {device.name} ({bdf}) is not a live controller now")
        want = device.attributes.get("serial")
        if want and ctrl.serial != want:
            raise DeviceError(
                f"NVMe drive {device.name} ({bdf}) has serial {ctrl.serial!r}, "
                f"published as {want!r}: a different drive, not prepared"
            )
        nodes: list[DeviceNode] = []
        lists: list[tuple[str, str]] = []
        for ns in ctrl.namespaces:
            nodes.append(cdi_node(self._dev, ns.block, "b"))
            lists.append((DEVICES_ENV, f"/dev/{ns.block.name}"))
            if ns.generic is not None:
                nodes.append(cdi_node(self._dev, ns.generic, "c"))
                lists.append((GENERIC_ENV, f"/dev/{ns.generic.name}"))
        return Preparation(
            edits=ContainerEdits(device_nodes=tuple(nodes)),
            claim_lists=tuple(lists),
            indexed_env=(("PATCHBAY_NVME_SERIAL", ctrl.serial), ("PATCHBAY_NVME_PCI_BUS_ID", bdf)),
        )

    def prepare_admin(self, device: Device, holder: Mapping[str, Any] | None) -> Preparation:
        ctrl = controller_at(self._sysfs, device.local_id)
        if ctrl is None or ctrl.node is None:
            raise DeviceError(f"NVMe drive {device.name} ({device.local_id}) has no controller now")
        return Preparation(
            edits=ContainerEdits(device_nodes=(cdi_node(self._dev, ctrl.node, "c"),)),
            claim_lists=(("PATCHBAY_NVME_ADMIN_DEVICES", f"/dev/{ctrl.node.name}"),),
        )

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        return None  # nothing changed on the host; the claim's CDI spec goes with it

    def common_edits(self) -> ContainerEdits | None:
        return None
