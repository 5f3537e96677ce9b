"""Hand a whole GPU to a virtual machine: bind it to ``vfio-pci`` and back.

Why this module exists: KubeVirt (``GPUsWithDRA``) gives a VM a GPU by PCI
address, and the VM's QEMU opens it through VFIO, so the GPU must leave
NVIDIA's driver for ``vfio-pci`` while the claim holds it and come back
afterwards. A claim asks for that with ``GpuConfig.passthrough: vfio-pci``
(the DeviceClass ``vfio-gpu.patchbay.dev`` carries it; docs/design.md says
why a mode and not a device of its own). The rebinding is the VFs'
sequence (``driver.pci.rebind``: driver_override, unbind, bind or
drivers_probe, each step waited for); the container gets
``/dev/vfio/vfio`` and ``/dev/vfio/<group>`` (``driver.devices.vfio``).

What is recorded before anything changes (``plan_undo``, checkpointed as
PrepareStarted by the preparer because :meth:`GpuPassthrough.changes_device`
says so) is the GPU's PCI address, driver and override: NVML no longer
sees a GPU on ``vfio-pci``, so after a crash the address is known only from
there. :meth:`GpuPassthrough.release` acts on what sysfs shows (a GPU on
``vfio-pci`` or with our override), so it is idempotent and a no-op for a
GPU prepared for CUDA.

Refusals, each with a message naming the GPU and what holds it: MIG mode or
MIG instances (``mig_refusal``, from NVML), an MPS control daemon serving
the GPU, and any process holding its ``/dev/nvidia<minor>`` open (a share's
container, an MPS server, a CUDA program): unbinding NVIDIA's driver under
them would hang or kill them. Prepared shares of the GPU are refused
earlier, by the preparer's holder check (a share's local id is the GPU's
UUID).

While bound to ``vfio-pci`` the GPU is invisible to NVML, so scans publish
neither it nor its MIG partitions and shares: nothing else can be given it.
``on_change`` (set by the plugin) asks for a rescan after each rebind, so it
is published again as soon as it is released.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from driver.cdi import ContainerEdits
from driver.devices.model import PCI_BUS_ID, Device
from driver.devices.vfio import vfio_nodes
from driver.errors import DeviceError
from driver.pci import sysfs
from driver.pci.rebind import VFIO_PCI, bind_vfio, read_override, restore
from driver.pci.writes import driver_of, iommu_group, write_attr

log = logging.getLogger(__name__)

MODE = VFIO_PCI  # the one value GpuConfig.passthrough takes
MPS_CONTROL = "nvidia-cuda-mps-control"
# Undo keys; "pci" is present exactly when the GPU's address was known.
PCI, DRIVER, OVERRIDE = "pci", "driver", "override"


def env_prefix(device: Device) -> str:
    """``gpu-0`` -> ``PATCHBAY_GPU_0``."""
    return "PATCHBAY_" + device.name.upper().replace("-", "_")


class GpuPassthrough:
    """Binds GPUs to ``vfio-pci`` for claims that ask, and restores them."""

    def __init__(
        self,
        sysfs_root: Path,
        dev_root: Path,
        *,
        proc_root: Path = Path("/proc"),
        mig_refusal: Callable[[str], str | None] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self._sysfs = sysfs_root
        self._dev = dev_root
        self._proc = proc_root
        self._mig_refusal = mig_refusal
        self._timeout = timeout
        self.on_change: Callable[[], None] | None = None
        # Told (GPU UUID, True) before a GPU leaves NVIDIA's driver for
        # vfio-pci and (UUID, False) once it is back: NVML loses such a GPU on
        # purpose, which its XID watcher reports as XID 79 (set by the plugin:
        # the health monitor's handed_over).
        self.on_handover: Callable[[str, bool], None] | None = None

    def _path(self, bdf: str) -> Path | None:
        try:
            return sysfs.device_path(self._sysfs, bdf)
        except (OSError, ValueError):
            return None

    def planned(self, undo: Mapping[str, Any]) -> bool:
        """Whether ``undo`` is a passthrough's (:meth:`plan_undo` made it)."""
        return isinstance(undo.get(PCI), str)

    def plan_undo(self, device: Device) -> dict[str, Any]:
        """The GPU's address, driver and override, read before any change."""
        bdf = device.attributes.get(PCI_BUS_ID)
        path = self._path(bdf) if isinstance(bdf, str) else None
        if path is None:
            return {}
        return {PCI: bdf, DRIVER: driver_of(path), OVERRIDE: read_override(path)}

    def prepare(self, device: Device) -> ContainerEdits:
        """Bind ``device`` to ``vfio-pci`` (refusing a GPU in use); its vfio edits."""
        if device.kind != "gpu":
            raise DeviceError(
                f"passthrough {MODE}: {device.name} is a {device.kind} device; only a whole "
                "GPU can be handed to a VM (ask for a device of class vfio-gpu.patchbay.dev)"
            )
        bdf = device.attributes.get(PCI_BUS_ID)
        path = self._path(bdf) if isinstance(bdf, str) else None
        if path is None or not isinstance(bdf, str):
            raise DeviceError(f"GPU {device.name} ({device.local_id}) has no PCI address in sysfs")
        group = iommu_group(path)
        if group is None:
            raise DeviceError(
                f"GPU {device.name} ({bdf}) has no IOMMU group: it cannot be bound to "
                f"{MODE} (is the IOMMU enabled on this node?)"
            )
        if driver_of(path) != VFIO_PCI:  # a retried prepare finds it bound already
            self._refuse_if_in_use(device, bdf)
            if self.on_handover is not None:
                self.on_handover(device.local_id, True)
            bind_vfio(self._sysfs, bdf, path, self._timeout)
            log.info("GPU %s (%s) handed over to %s", device.name, bdf, VFIO_PCI)
            self._changed()
        prefix = env_prefix(device)
        env = (
            f"{prefix}_PCI_BUS_ID={bdf}",
            f"{prefix}_MODE={MODE}",
            f"{prefix}_VFIO_GROUP={group}",
        )
        return ContainerEdits(env=env, device_nodes=vfio_nodes(self._dev, group))

    def release(self, local_id: str, undo: Mapping[str, Any]) -> None:
        """Give the GPU back to its driver if it is on ``vfio-pci``; idempotent."""
        bdf = undo.get(PCI)
        path = self._path(bdf) if isinstance(bdf, str) else None
        if path is None or not isinstance(bdf, str):
            return
        if driver_of(path) != VFIO_PCI and read_override(path) != VFIO_PCI:
            return  # prepared for CUDA, or restored already
        original = undo.get(DRIVER)
        original = original if isinstance(original, str) and original != VFIO_PCI else None
        restore(self._sysfs, bdf, path, original, self._timeout)
        override = undo.get(OVERRIDE)
        if override and override != VFIO_PCI:
            write_attr(path / "driver_override", str(override))
        if self.on_handover is not None:
            self.on_handover(local_id, False)
        log.info("GPU %s (%s) back on %s", local_id, bdf, original)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _refuse_if_in_use(self, device: Device, bdf: str) -> None:
        uuid = device.local_id
        what = f"GPU {device.name} ({uuid}, {bdf}) cannot be handed over to {MODE}"
        if self._mig_refusal is not None and (why := self._mig_refusal(uuid)):
            raise DeviceError(f"{what}: {why}")
        minor = device.attributes.get("minor")
        node = f"/dev/nvidia{minor}" if isinstance(minor, int) else None
        mps, users = [], []
        for pid, argv, environ, fds in self._processes(node):
            if any(Path(a).name == MPS_CONTROL for a in argv[:2]) and uuid in environ:
                mps.append(pid)
            elif fds:
                users.append(pid)
        if mps:
            raise DeviceError(f"{what}: an MPS control daemon serves it (pid {mps[0]})")
        if users:
            raise DeviceError(
                f"{what}: {len(users)} process(es) hold {node} open "
                f"(pids {', '.join(map(str, users[:5]))}): a share or CUDA program still runs"
            )

    def _processes(self, node: str | None) -> Iterator[tuple[int, list[str], str, bool]]:
        """(pid, argv, environ, holds ``node`` open) of each process we can read."""
        for entry in self._proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                environ = (entry / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue  # gone, or not ours to read
            yield int(entry.name), argv, environ, node is not None and _holds(entry, node)


def _holds(proc: Path, node: str) -> bool:
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if str(fd.readlink()) == node:
                return True
        except OSError:
            continue
    return False
