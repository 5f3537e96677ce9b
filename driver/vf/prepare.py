"""Prepare a VF for a container: keep its netdev, or hand it over as vfio.

Why this module exists: it is the VF family's
:class:`driver.devices.handler.DeviceHandler`. ``netdev`` mode (the default)
changes nothing on the host; the container learns the VF's PCI address and
interface name from environment variables (moving the netdev into the pod's
network namespace is the CNI's job). ``vfio-pci`` mode rebinds the VF and
adds ``/dev/vfio/<group>`` and ``/dev/vfio/vfio``. A bandwidth tier
(:mod:`driver.vf.bandwidth`) also names its share, ``<prefix>_BANDWIDTH_MBPS``
(the rate is not applied to the VF: see docs/sharing.md). The original driver is
recorded by :meth:`VfHandler.plan_undo` before anything changes, so an
unprepare (or the rollback of a crashed prepare) puts it back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from driver.cdi import ContainerEdits
from driver.config.opaque import DeviceConfig
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.devices.vfio import vfio_nodes
from driver.errors import DeviceError
from driver.pci import sysfs
from driver.pci.rebind import bind_vfio, read_override, restore
from driver.pci.writes import driver_of, iommu_group, write_attr
from driver.vf.bandwidth import share_mbps, vf_name
from driver.vf.config import VfConfig
from driver.vf.discovery import netdev_of

log = logging.getLogger(__name__)


def env_prefix(device: Device) -> str:
    """``vf-0000-17-00-2`` -> ``PATCHBAY_VF_0000_17_00_2`` (every bandwidth
    tier of a VF, ``vf-0000-17-00-2-40g``, has its VF's prefix)."""
    return "PATCHBAY_" + vf_name(device).upper().replace("-", "_")


class VfHandler:
    """Prepares ``vf`` devices; always checkpointed first (vfio rebinds)."""

    kind = "vf"
    has_side_effects = True
    blocking = True

    def __init__(self, sysfs_root: Path, dev_root: Path, timeout: float = 10.0) -> None:
        self._sysfs = sysfs_root
        self._dev = dev_root
        self._timeout = timeout

    def _path(self, bdf: str) -> Path:
        try:
            return sysfs.device_path(self._sysfs, bdf)
        except (OSError, ValueError) as exc:
            raise DeviceError(f"VF {bdf} is not in sysfs: {exc}") from exc

    def plan_undo(self, device: Device, config: DeviceConfig | None = None) -> dict[str, Any]:
        path = self._path(device.local_id)
        return {"driver": driver_of(path), "override": read_override(path)}

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        bdf = device.local_id
        path = self._path(bdf)
        mode = config.mode if isinstance(config, VfConfig) else "netdev"
        prefix = env_prefix(device)
        env = [f"{prefix}_PCI_BUS_ID={bdf}", f"{prefix}_MODE={mode}"]
        if (share := share_mbps(device)) is not None:
            env.append(f"{prefix}_BANDWIDTH_MBPS={share}")
        if mode == "netdev":
            netdev = netdev_of(path)
            if netdev is None:
                raise DeviceError(
                    f"VF {device.name} ({bdf}) has no network interface "
                    f"(bound to {driver_of(path)})"
                )
            env.append(f"{prefix}_NETDEV={netdev}")
            network = {"interfaceName": netdev}  # its device metadata (KEP-5304)
            with contextlib.suppress(OSError):
                network["hardwareAddress"] = (path / "net" / netdev / "address").read_text().strip()
            return Preparation(edits=ContainerEdits(env=tuple(env)), network=network)
        group = iommu_group(path)
        if group is None:
            raise DeviceError(
                f"VF {device.name} ({bdf}) has no IOMMU group: it cannot be prepared for "
                "vfio-pci (is the IOMMU enabled on this node?)"
            )
        bind_vfio(self._sysfs, bdf, path, self._timeout)
        env.append(f"{prefix}_VFIO_GROUP={group}")
        nodes = vfio_nodes(self._dev, group)
        return Preparation(
            edits=ContainerEdits(env=tuple(env), device_nodes=nodes), undo={"mode": mode}
        )

    def prepare_admin(self, device: Device, holder: Mapping[str, Any] | None) -> Preparation:
        """Admin access (``driver.claims.admin``): the VF's address and, when it
        is a netdev, its interface name; never a rebind, never the vfio group
        (a vfio group is opened by one process: the holder's)."""
        bdf = device.local_id
        path = self._path(bdf)
        prefix = env_prefix(device)
        env = [f"{prefix}_PCI_BUS_ID={bdf}", f"{prefix}_ADMIN_ACCESS=true"]
        if (netdev := netdev_of(path)) is not None:
            env.append(f"{prefix}_NETDEV={netdev}")
        return Preparation(edits=ContainerEdits(env=tuple(env)))

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        original = undo.get("driver")
        try:
            path = sysfs.device_path(self._sysfs, local_id)
        except (OSError, ValueError):
            log.warning("VF %s is gone; nothing to restore", local_id)
            return
        restore(self._sysfs, local_id, path, original, self._timeout)
        override = undo.get("override")
        if override:
            write_attr(path / "driver_override", str(override))

    def common_edits(self) -> ContainerEdits | None:
        return None
