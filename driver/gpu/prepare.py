"""Prepare a full GPU: CDI edits only, the GPU itself needs no change.

The container gets the GPU's device node, and its UUID is one item of
``NVIDIA_VISIBLE_DEVICES`` (what the NVIDIA container toolkit understands),
which the claim's spec sets once to the UUIDs of all the claim's GPUs and
MIG devices (see ``Preparation.claim_lists``); the control nodes every GPU
container needs go into the spec's common edits.
A GPU that dynamic MIG may partition (its device consumes counters) is
first claimed whole through the MIG guard, which refuses while partitions
exist and ends MIG mode on Hopper.
Device numbers come from the node's ``/dev`` when the node exists there
(``--dev-root``), otherwise from NVIDIA's fixed character major 195.
A claim whose ``GpuConfig`` asks for ``passthrough`` gets the GPU bound to
``vfio-pci`` instead (``driver.gpu.passthrough``); that changes the device,
so such a claim is checkpointed before it (:meth:`GpuHandler.changes_device`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from driver.cdi import ContainerEdits, DeviceNode
from driver.config.opaque import DeviceConfig, GpuConfig
from driver.devices.handler import Preparation
from driver.devices.model import Device
from driver.errors import DeviceError
from driver.gpu.device_dir import DeviceDirectory

if TYPE_CHECKING:
    from driver.gpu.passthrough import GpuPassthrough

NVIDIA_MAJOR = 195
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NVIDIACTL_MINOR = 255


class WholeGpuGuard(Protocol):
    """Claims a partitionable GPU whole (``driver.mig.guard.MigGuard``).

    A protocol, so that the MIG family builds on this one and not the
    other way round.
    """

    def acquire_full(self, uuid: str) -> None: ...
    def release_full(self, uuid: str) -> None: ...


class GpuHandler:
    """The :class:`driver.devices.handler.DeviceHandler` for full GPUs."""

    kind = "gpu"
    has_side_effects = False

    def __init__(
        self,
        dev_root: Path = Path("/dev"),
        guard: WholeGpuGuard | None = None,
        passthrough: GpuPassthrough | None = None,
    ) -> None:
        self._nodes = DeviceDirectory(dev_root)  # the nodes, stat'ed once per change
        self._guard = guard
        self._passthrough = passthrough
        # The MIG guard blocks (NVML, the session lock scans hold), and so does
        # a rebind to vfio-pci, for the claims that ask for one only
        # (blocking_for_*); a plain GPU's prepare is a stat call.
        self.blocking = guard is not None

    def blocking_for_config(self, parameters: Mapping[str, Any]) -> bool:
        """A claim whose config asks for passthrough rebinds the GPU (sysfs waits)."""
        return self._passthrough is not None and PASSTHROUGH_FIELD in parameters

    def blocking_for_undo(self, undo: Mapping[str, Any]) -> bool:
        """A device prepared for passthrough is given back by a rebind."""
        return self._passthrough is not None and self._passthrough.planned(undo)

    def changes_device(self, config: DeviceConfig | None) -> bool:
        """Whether preparing with ``config`` changes the GPU (a rebind)."""
        return self._passthrough is not None and _passthrough(config)

    def node(self, name: str, default_minor: int | None) -> DeviceNode | None:
        st = self._nodes.stat(name)  # four per prepare, read again only on a change
        if st is None:
            if default_minor is None:
                return None
            return DeviceNode(path=f"/dev/{name}", major=NVIDIA_MAJOR, minor=default_minor)
        if not stat.S_ISCHR(st.st_mode):
            return DeviceNode(path=f"/dev/{name}", major=NVIDIA_MAJOR, minor=default_minor or 0)
        return DeviceNode(
            path=f"/dev/{name}",
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            host_path=self._nodes.path(name),
        )

    def plan_undo(self, device: Device, config: DeviceConfig | None = None) -> dict[str, Any]:
        """Only a passthrough claim's: the GPU's address, driver and override
        (sysfs reads every other claim is spared, issue 36)."""
        if self._passthrough is not None and _passthrough(config):
            return self._passthrough.plan_undo(device)
        return {}

    def prepare(self, device: Device, claim_uid: str, config: DeviceConfig | None) -> Preparation:
        if _passthrough(config) and self._passthrough is None:
            raise DeviceError(f"{device.name}: GPU passthrough is not available on this node")
        if self._guard is not None and device.has_counters():
            self._guard.acquire_full(device.local_id)
        if self._passthrough is not None and _passthrough(config):
            return Preparation(edits=self._passthrough.prepare(device))
        minor = device.attributes.get("minor")
        minor = minor if isinstance(minor, int) and not isinstance(minor, bool) else 0
        env = []
        if isinstance(config, GpuConfig) and config.driver_capabilities:
            env.append(f"NVIDIA_DRIVER_CAPABILITIES={','.join(config.driver_capabilities)}")
        node = self.node(f"nvidia{minor}", minor)
        nodes = (node,) if node else ()
        return Preparation(
            edits=ContainerEdits(env=tuple(env), device_nodes=nodes),
            claim_lists=((VISIBLE_DEVICES, device.local_id),),
        )

    def prepare_admin(self, device: Device, holder: Mapping[str, Any] | None) -> Preparation:
        """Admin access (``driver.claims.admin``): the GPU's node and UUID, no guard."""
        minor = device.attributes.get("minor")
        minor = minor if isinstance(minor, int) and not isinstance(minor, bool) else 0
        node = self.node(f"nvidia{minor}", minor)
        return Preparation(
            edits=ContainerEdits(device_nodes=(node,) if node else ()),
            claim_lists=((VISIBLE_DEVICES, device.local_id),),
        )

    def unprepare(self, kind: str, local_id: str, undo: Mapping[str, Any]) -> None:
        if self._passthrough is not None:
            self._passthrough.release(local_id, undo)
        if self._guard is not None:
            self._guard.release_full(local_id)

    def common_edits(self) -> ContainerEdits | None:
        nodes = [self.node("nvidiactl", NVIDIACTL_MINOR)]
        nodes += [self.node(n, None) for n in ("nvidia-uvm", "nvidia-uvm-tools")]
        return ContainerEdits(device_nodes=tuple(n for n in nodes if n is not None))


PASSTHROUGH_FIELD = "passthrough"  # GpuConfig.passthrough, as a raw config spells it


def _passthrough(config: DeviceConfig | None) -> bool:
    return isinstance(config, GpuConfig) and config.passthrough is not None
