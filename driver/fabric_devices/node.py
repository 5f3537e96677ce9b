"""The node plugin's view of devices that came through fabric adapters.

Why: a GPU or NIC the fabric attached to this node sits under one of the
node's fabric adapter ports in sysfs. It belongs to the fabric claim that
asked for it, so it must never be published as a free local device; instead
the plugin keeps it in the (unpublished) fabric pool of its inventory under
the variant name the controller published, and prepares it like a local
device: a GPU as a GPU, a NIC as its VF 0 (the controller offers a fabric
NIC as one VF; its other VFs stay unused until it is detached), an NVMe
drive as itself, named by its serial, a CXL memory device as itself, named
by its memdev (``<serial>@<BDF>``: the logical devices of one CXL MLD share
the serial; docs/fabric.md, "Logical devices"). The adapters
come from the ``--fabric-adapters`` setting (``name=portBDF``); their root
complexes are read from sysfs and reported to the controller in the Node
annotation, together with the UUIDs of the attached GPUs, the permanent
MAC addresses of the attached NICs' PFs, the serials of the attached
NVMe drives and the memdev keys of the attached CXL memory, and each attached GPU's board serial
(NVML's, the only name a count-based fabric manager gives what it attached).
An attached GPU the node's health monitor found failed is named there too,
with its class, taint effect and reason (``failed``): the fabric pool is the
controller's, which taints the device there (docs/health.md).
A GPU is busy in that report while a claim holds it or any part of it (a
MIG placement, a share), or while NVML shows a MIG instance or a process on
it (:mod:`driver.fabric_devices.usage`): the controller detaches nothing
busy, and a real host hot-removes a GPU in use without refusing (issue 34).
A fabric GPU's MIG placements and shares are offered nowhere.

Concurrency: :meth:`FabricNodeView.split` reads sysfs (adapter roots
included) and runs in the scan's worker thread; :meth:`FabricNodeView.report`
reuses those roots and runs on the loop after every prepare/unprepare (and
after each NVML probe that changed its answer); the plugin writes the
annotation whenever it changed (:class:`driver.kube.node_annotation.NodeAnnotation`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from driver.cxl import KIND as CXL_MEMORY
from driver.devices.inventory import ALIAS
from driver.devices.model import ATTACHMENT, PCI_BUS_ID, Device
from driver.errors import ConfigError
from driver.fabric_devices.naming import (
    DeviceFailure,
    NodeFabric,
    cxl_key,
    identity,
    variant_name,
)
from driver.fabric_devices.usage import FabricUsage
from driver.gpu.discovery import Place
from driver.gpu.fraction import KIND as SHARED_GPU
from driver.health.monitor import TAINT_KEY, HealthMonitor
from driver.nvme import KIND as NVME
from driver.pci import sysfs

log = logging.getLogger(__name__)

IDENTITY = "fabricIdentity"  # GPU UUID, NIC MAC, NVMe serial or CXL memdev key (unpublished)
# Device kinds offered as themselves when behind an adapter, named by their serial attribute.
BY_SERIAL = (NVME, CXL_MEMORY)
# Kinds that hold a GPU whole or in part ("mig": driver.mig.layout.KIND, a layer above).
GPU_KINDS = ("gpu", "mig", SHARED_GPU)


def gpu_of(device: Device) -> str | None:
    """The UUID of the GPU a MIG placement (its ``parent``) or a shared twin
    (same identity as its GPU) is carved from; None for any other device."""
    if device.parent is not None:
        return device.parent
    return device.local_id if device.kind == SHARED_GPU else None


def held_gpus(held: Collection[tuple[str, str]]) -> set[str]:
    """UUIDs of the GPUs that ``held`` (kind, local id) holds whole or in part:
    a MIG placement's local id starts with its GPU's (``<uuid>:<profile>:<start>``,
    ``driver.mig.layout.local_id``), a share's is its GPU's."""
    return {local_id.partition(":")[0] for kind, local_id in held if kind in GPU_KINDS}


def gpu_failures(health: HealthMonitor, fabric: Sequence[Device]) -> dict[str, DeviceFailure]:
    """UUID -> the failure of each attached fabric GPU the node found unhealthy:
    the taint it would publish a local GPU with (effect, value, since) and
    the class of its record (one without a class reads as replace: never
    reset, as ``driver.health.monitor.failure_class`` reads it)."""
    out = {}
    for d in health.tainted([d for d in fabric if d.kind == "gpu"]):
        for taint in d.taints:
            if taint.key == TAINT_KEY:
                record = health.records.get(d.local_id)
                cls = record.failure_class if record is not None else "replace"
                out[d.local_id] = DeviceFailure(cls, taint.effect, taint.value, taint.time_added)
    return out


def parse_adapters(spec: str) -> dict[str, str]:
    """``adapter0=0000:15:02.0,adapter1=0000:85:01.0`` -> {name: port BDF}."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, bdf = item.partition("=")
        if not sep or not name.strip() or not bdf.strip():
            raise ConfigError(f"fabric adapter {item!r}: expected name=portBDF")
        out[name.strip()] = bdf.strip().lower()
    return out


FILE_PREFIX = "file:"


def load_adapters(setting: str) -> dict[str, str]:
    """The ``--fabric-adapters`` setting: inline ``name=portBDF,...`` or ``file:<path>``.

    The file form lets one DaemonSet serve nodes with and without adapters: each
    node carries its own list (same syntax, whitespace or commas between
    entries); a node without the file has no fabric adapters.
    """
    if not setting.startswith(FILE_PREFIX):
        return parse_adapters(setting)
    path = Path(setting[len(FILE_PREFIX) :])
    try:
        text = path.read_text()
    except FileNotFoundError:
        log.info("no fabric adapters on this node (%s does not exist)", path)
        return {}
    except OSError as exc:
        raise ConfigError(f"fabric adapters file {path}: {exc}") from exc
    try:
        return parse_adapters(",".join(text.split()))
    except ConfigError as exc:
        raise ConfigError(f"fabric adapters file {path}: {exc}") from exc


class FabricNodeView:
    """Splits a node scan into local devices and fabric-attached GPUs."""

    def __init__(self, node_name: str, adapters: Mapping[str, str], sysfs_root: Path) -> None:
        self.node_name = node_name
        self.adapters = dict(adapters)
        self.sysfs_root = sysfs_root
        self._roots: dict[str, str] | None = None  # read at each scan (split)

    def adapter_roots(self) -> dict[str, str]:
        roots = {}
        for name, port in self.adapters.items():
            try:
                roots[name] = sysfs.pcie_root(self.sysfs_root, port)
            except (OSError, ValueError) as exc:
                log.warning("fabric adapter %s (%s): no root complex: %s", name, port, exc)
        return roots

    def adapter_of(self, bdf: str) -> str | None:
        """The adapter whose port ``bdf`` sits behind, if any."""
        path = self._path(bdf)
        return self._adapter_above(path) if path is not None else None

    def _path(self, bdf: str) -> Path | None:
        """The device's sysfs directory; None once it has left the bus."""
        try:
            return sysfs.device_path(self.sysfs_root, bdf)
        except (OSError, ValueError):
            return None

    def _adapter_above(self, path: Path) -> str | None:
        parts = path.parts[:-1]
        for name, port in self.adapters.items():
            if port in parts:
                return name
        return None

    def behind_adapter(self, bdf: str) -> bool:
        return self.adapter_of(bdf) is not None

    def detached(self, gpus: Mapping[str, str], attached: Sequence[Device]) -> list[str]:
        """Which of ``gpus`` (UUID -> the PCI address it had here) left the node:
        nothing at that address any more, or another GPU there. One the scan
        did not find (NVML lost it or is unavailable) but still on the bus has
        not left; reads sysfs, so it runs where :meth:`split` does."""
        here = {d.local_id for d in attached if d.kind == "gpu"}
        at = {d.attributes.get(PCI_BUS_ID): d.local_id for d in attached if d.kind == "gpu"}
        gone = []
        for uuid, bdf in gpus.items():
            if uuid in here or not bdf:
                continue  # still here, or no address to tell by: the failure stays
            if at.get(bdf, uuid) != uuid or self._path(bdf) is None:
                gone.append(uuid)
        return gone

    def place(self, bdf: str) -> Place:
        """Where the GPU at ``bdf`` sits, from one look at sysfs: the scan
        numbers local GPUs first (``driver.gpu.discovery.local_first``)."""
        path = self._path(bdf)
        if path is None:
            return Place.GONE
        return Place.LOCAL if self._adapter_above(path) is None else Place.FABRIC

    def pf_mac(self, pf_bdf: str) -> str | None:
        """The permanent MAC address of a PF's first network interface."""
        try:
            net = sysfs.device_path(self.sysfs_root, pf_bdf) / "net"
            names = sorted(p.name for p in net.iterdir())
            mac = (net / names[0] / "address").read_text().strip().lower() if names else ""
        except (OSError, ValueError):
            return None
        return mac or None

    def _fabric_name(self, device: Device, adapter: str) -> tuple[str, str] | None:
        """(variant name, identity) of a device behind ``adapter``, or None if not offered."""
        if device.kind == "gpu":
            return variant_name(device.local_id, self.node_name, adapter), device.local_id
        serial = device.attributes.get("serial")
        bdf = device.attributes.get(PCI_BUS_ID)
        if device.kind == CXL_MEMORY and isinstance(serial, str) and serial.strip():
            if not isinstance(bdf, str):
                return None
            ident = cxl_key(serial, bdf)  # the LDs of one MLD share the serial
            return variant_name(ident, self.node_name, adapter, device.kind), ident
        if device.kind in BY_SERIAL and isinstance(serial, str) and serial.strip():
            ident = identity(device.kind, serial)
            return variant_name(ident, self.node_name, adapter, device.kind), ident
        pf = device.attributes.get("pfPciBusID")
        if device.kind == "vf" and device.attributes.get("vfIndex") == 0 and isinstance(pf, str):
            mac = self.pf_mac(pf)
            if mac:
                return variant_name(mac, self.node_name, adapter, "nic"), mac
        return None

    def split(self, devices: Sequence[Device]) -> tuple[list[Device], list[Device]]:
        """(local devices, fabric devices renamed to their fabric pool variant).

        A fabric GPU's MIG placements and shared twin are offered nowhere:
        offered locally, they drew on counters the fabric pool cannot see,
        and the scheduler gave one GPU whole to a fabric claim and in parts
        to local claims (issue 34). A placement names no PCI address (the
        lean slices), so it follows its GPU (:func:`gpu_of`), kept in the
        node's order.
        """
        self._roots = self.adapter_roots()
        kept: list[Device] = []  # local candidates, in the scan's order
        fabric: list[Device] = []
        not_local: set[str] = set()  # GPUs behind an adapter or gone: none of their parts
        for device in devices:
            bdf = device.attributes.get(PCI_BUS_ID)
            if gpu_of(device) is not None:
                kept.append(device)  # decided by its GPU, below
                continue
            # One look at sysfs decides both whether the device is still there
            # and where it sits: with two, a detach that hot-removes it in
            # between made a present device "behind no adapter", a local one.
            path = self._path(bdf) if isinstance(bdf, str) else None
            if isinstance(bdf, str) and path is None:
                # It left the bus between the scan and now (a fabric detach
                # hot-removes it): where it sat is unknown, so it is not
                # offered as local; the removal's rescan settles it.
                log.info("%s (%s) is gone from sysfs: not offered", device.name, bdf)
                not_local.add(device.local_id)
                continue
            adapter = self._adapter_above(path) if path is not None else None
            named = self._fabric_name(device, adapter) if adapter is not None else None
            if adapter is None:
                kept.append(device)
                continue
            not_local.add(device.local_id)
            if named is not None:
                attrs = {
                    **device.attributes,
                    ATTACHMENT: "fabric",
                    "fabricAdapter": adapter,
                    IDENTITY: named[1],
                }
                fabric.append(dataclasses.replace(device, name=named[0], attributes=attrs))
            else:
                log.debug("%s is behind fabric adapter %s: not offered", device.name, adapter)
        fabric = self._with_serial_names(fabric)
        local = [d for d in kept if gpu_of(d) not in not_local]
        if len(local) < len(kept):
            log.debug("%d MIG placements or shares of fabric GPUs not offered",
                      len(kept) - len(local))  # fmt: skip
        return local, fabric

    def _with_serial_names(self, fabric: list[Device]) -> list[Device]:
        """CXL memory alone with its serial behind its adapter also answers to
        the name from the serial (:data:`ALIAS`): the name published for it,
        and allocated, before the node told the LDs of one MLD apart; a claim
        allocated then, with no ``preparedAs``, is prepared as it was."""
        by_serial: dict[tuple[str, str], list[int]] = {}
        for i, d in enumerate(fabric):
            if d.kind == CXL_MEMORY:
                where = (str(d.attributes["serial"]), str(d.attributes["fabricAdapter"]))
                by_serial.setdefault(where, []).append(i)
        out = list(fabric)
        for (serial, adapter), at in by_serial.items():
            if len(at) == 1:
                old = variant_name(identity(CXL_MEMORY, serial), self.node_name, adapter,
                                   CXL_MEMORY)  # fmt: skip
                d = out[at[0]]
                out[at[0]] = dataclasses.replace(d, attributes={**d.attributes, ALIAS: old})
        return out

    def report(
        self,
        fabric: Sequence[Device],
        held: Collection[tuple[str, str]] = (),
        usage: FabricUsage | None = None,
        failed: Mapping[str, DeviceFailure] | None = None,
    ) -> NodeFabric:
        """The node's report; ``held``: (kind, local id) of the devices claims
        hold; ``usage``: what NVML says of the GPUs no claim holds; ``failed``:
        the GPUs the node found unhealthy, by UUID (:func:`gpu_failures`),
        reported by name so that the controller taints them in its pool.

        A GPU is busy, not to be detached, while a claim holds it whole, one
        of its MIG placements or a share of it, or while NVML shows a MIG
        instance or a process on it.
        """
        seen: dict[str, dict[str, str]] = {k: {} for k in ("gpu", "nic", *BY_SERIAL)}
        busy: set[str] = set()
        gpus_in_use = held_gpus(held)
        if usage is not None:
            gpus_in_use |= usage.busy([d.local_id for d in fabric if d.kind == "gpu"], gpus_in_use)
        serials: dict[str, str] = {}
        failures: dict[str, DeviceFailure] = {}
        for d in fabric:
            ident = str(d.attributes[IDENTITY])
            if d.kind == "gpu" and failed and d.local_id in failed:
                failures[ident] = failed[d.local_id]
            serial = d.attributes.get("serial")
            if d.kind == "gpu" and isinstance(serial, str) and serial.strip():
                serials[serial.strip()] = ident  # what a count-based manager names it by
            seen["nic" if d.kind == "vf" else d.kind][ident] = str(
                d.attributes.get("fabricAdapter", "")
            )
            if (d.kind, d.local_id) in held or (d.kind == "gpu" and d.local_id in gpus_in_use):
                busy.add(ident)
                if d.kind == CXL_MEMORY:  # by serial too: what a controller compares
                    busy.add(str(d.attributes["serial"]))
        # The roots of the last scan: a report after each prepare reads no sysfs.
        roots = self._roots if self._roots is not None else self.adapter_roots()
        return NodeFabric(
            roots, seen["gpu"], seen["nic"], frozenset(busy), seen[NVME], seen[CXL_MEMORY],
            serials, failures,
        )  # fmt: skip
