"""Find SR-IOV physical functions and their virtual functions in sysfs.

Why this module exists: VFs are not visible to NVML, and their placement
(``pcieRoot``, ``numaNode``) must come from the same sysfs tree the GPU scan
reads, so a GPU and a VF behind one root complex carry equal attributes.
A PF is a network-class function (``0x02xxxx``) with ``sriov_totalvfs``;
its VFs are the targets of its ``virtfnN`` links. Only PFs matched by the
plugin's :class:`driver.vf.config.PfPoolConfig` are offered; a PF whose
selector has ``bandwidthTiers`` has its VFs offered as bandwidth tiers
(:mod:`driver.vf.bandwidth`) of its line rate, read from ``net/<if>/speed``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from driver.devices.kind import Discovery
from driver.devices.model import (
    ATTACHMENT,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttributeValue,
    CounterSet,
    Device,
)
from driver.pci import sysfs
from driver.vf import bandwidth
from driver.vf.config import PfPoolConfig, PfSelector, normalize_id

log = logging.getLogger(__name__)

# ARPHRD_* values in net/<if>/type.
LINK_TYPES = {1: "ethernet", 32: "infiniband"}
PCI_ID = re.compile(r"^(0x)?[0-9a-fA-F]{1,4}$")


@dataclass(frozen=True)
class PhysFn:
    """A network PF with SR-IOV capability, as read from sysfs."""

    bdf: str
    path: Path
    netdev: str | None
    vendor: str
    device: str
    total_vfs: int
    num_vfs: int
    link_type: str
    speed_mbps: int | None = None  # net/<if>/speed; None: unknown (link down)


def read(path: Path) -> str | None:
    """A sysfs attribute's text; None when it is missing or unreadable (not
    a file, not UTF-8: never what the kernel writes)."""
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None


def read_int(path: Path) -> int | None:
    """A decimal sysfs attribute; None (with a warning naming the file when
    it exists) unless it holds ASCII digits."""
    raw = read(path)
    if raw is not None and raw.isascii() and raw.isdigit():
        return int(raw)
    if raw is not None or path.exists():
        log.warning("%s holds %r, not a number; ignored", path, raw)
    return None


def read_id(path: Path) -> str | None:
    """A PCI vendor/device id attribute as 4 hex digits; None unless it is one."""
    raw = read(path)
    return normalize_id(raw) if raw is not None and PCI_ID.match(raw) else None


def netdev_of(path: Path) -> str | None:
    """The first network interface name of a function (None when unbound)."""
    try:
        names = sorted(p.name for p in (path / "net").iterdir())
    except OSError:
        return None
    return names[0] if names else None


def speed_of(path: Path, netdev: str | None) -> int | None:
    """The link speed in Mb/s; None when unknown (the kernel says -1 or
    refuses the read while the link is down)."""
    raw = None if netdev is None else read(path / "net" / netdev / "speed")
    try:
        speed = int(raw) if raw is not None else 0
    except ValueError:
        speed = 0
    return speed if speed > 0 else None


def link_type(path: Path, netdev: str | None) -> str:
    if netdev is None:
        return "unknown"
    kind = read_int(path / "net" / netdev / "type")
    return "ethernet" if kind is None else LINK_TYPES.get(kind, "other")


def physical_functions(sysfs_root: Path) -> list[PhysFn]:
    """Every SR-IOV-capable network PF under ``sysfs_root``, by address."""
    out = []
    bus = sysfs_root / "bus" / "pci" / "devices"
    for link in sorted(bus.iterdir()) if bus.is_dir() else []:
        path = Path(os.path.realpath(link))
        klass = read(path / "class") or ""
        if not klass.lower().startswith("0x02"):
            continue
        if not (path / "sriov_totalvfs").exists():
            if any(path.glob("virtfn*")):
                _warn_once(path, "has VFs but no sriov_totalvfs (half removed?); not offered")
            continue  # (a NIC without SR-IOV)
        total = read_int(path / "sriov_totalvfs")
        if total is None or (path / "physfn").exists():
            continue  # unreadable: not offered (read_int named the file)
        netdev = netdev_of(path)
        out.append(
            PhysFn(
                bdf=link.name,
                path=path,
                netdev=netdev,
                vendor=read_id(path / "vendor") or "0000",
                device=read_id(path / "device") or "0000",
                total_vfs=total,
                num_vfs=read_int(path / "sriov_numvfs") or 0,
                link_type=link_type(path, netdev),
                speed_mbps=speed_of(path, netdev),
            )
        )
    return out


_warned: set[Path] = set()


def _warn_once(path: Path, what: str) -> None:
    """A PF sysfs shows only in part: said once per process, not every scan."""
    if path not in _warned:
        _warned.add(path)
        log.warning("PF %s (%s) %s", path.name, path, what)


def virtual_functions(pf: PhysFn) -> list[tuple[int, str]]:
    """(vfIndex, VF address) of the PF's current VFs, by index."""
    vfs = []
    for link in pf.path.glob("virtfn*"):
        suffix = link.name.removeprefix("virtfn")
        if suffix.isascii() and suffix.isdigit():
            try:
                target = link.readlink()
            except OSError:
                continue  # removed while we listed (sriov_numvfs shrinking)
            vfs.append((int(suffix), Path(target).name))
    return sorted(vfs)


def device_name(bdf: str) -> str:
    """A DNS label from a VF address: ``0000:17:00.2`` -> ``vf-0000-17-00-2``."""
    return "vf-" + bdf.lower().replace(":", "-").replace(".", "-")


def vf_device(sysfs_root: Path, pf: PhysFn, index: int, bdf: str) -> Device:
    vf_path = sysfs.device_path(sysfs_root, bdf)
    attrs: dict[str, AttributeValue] = {
        ATTACHMENT: "local",
        PCI_BUS_ID: bdf,
        "pfPciBusID": pf.bdf,
        "vfIndex": index,
        "vendorID": read_id(vf_path / "vendor") or pf.vendor,
        "deviceID": read_id(vf_path / "device") or "0000",
        "linkType": pf.link_type,
    }
    if pf.netdev:
        attrs["pfName"] = pf.netdev
    # The VF sits under the PF's parent, so its root is the PF's root.
    attrs[PCIE_ROOT] = sysfs.pcie_root(sysfs_root, bdf)
    numa = sysfs.numa_node(sysfs_root, bdf)
    if numa is None:
        numa = sysfs.numa_node(sysfs_root, pf.bdf)
    if numa is not None:
        attrs[NUMA_NODE] = numa
    return Device(name=device_name(bdf), kind="vf", local_id=bdf, attributes=attrs)


def scan(
    sysfs_root: Path, config: PfPoolConfig, always: Callable[[str], bool] | None = None
) -> Discovery:
    """The VFs of every selected PF (and of every PF ``always`` accepts by
    address, e.g. one behind a fabric adapter), PF by PF, VFs by index, with
    the counter sets of the PFs whose bandwidth is shared."""
    devices: list[Device] = []
    sets: list[CounterSet] = []
    for pf in physical_functions(sysfs_root):
        selector = config.select(pf.netdev, pf.bdf, pf.vendor, pf.device)
        if selector is None and not (always is not None and always(pf.bdf)):
            continue
        vfs = []
        for index, bdf in virtual_functions(pf):
            try:
                vfs.append((index, vf_device(sysfs_root, pf, index, bdf)))
            except (OSError, ValueError) as exc:
                log.warning("VF %s of PF %s left out: %s", bdf, pf.bdf, exc)
        if selector is None or selector.bandwidth_tiers is None:
            devices.extend(d for _, d in vfs)
            continue
        shared = shared_bandwidth(pf, selector, vfs)
        devices.extend(shared.devices)
        sets.extend(shared.counter_sets)
    return Discovery(devices=tuple(devices), counter_sets=tuple(sets))


def shared_bandwidth(pf: PhysFn, selector: PfSelector, vfs: list[tuple[int, Device]]) -> Discovery:
    """A bandwidth-managed PF's VFs as tiers of its line rate, and its counter
    sets; nothing (logged) when the line rate is unknown."""
    line = selector.line_rate or pf.speed_mbps
    if line is None:
        _warn_once(
            pf.path,
            f"has bandwidthTiers but no line rate (net/{pf.netdev}/speed unknown: link down?); "
            "its VFs are not offered until it is known or lineRate is set",
        )
        return Discovery()
    rates = selector.bandwidth_tiers or ()
    devices = [t for i, vf in vfs for t in bandwidth.tiers(vf, pf.bdf, i, rates, line)]
    sets = bandwidth.counter_sets(pf.bdf, line, [i for i, _ in vfs]) if devices else []
    return Discovery(devices=tuple(devices), counter_sets=tuple(sets))


def scan_vfs(
    sysfs_root: Path, config: PfPoolConfig, always: Callable[[str], bool] | None = None
) -> list[Device]:
    """The devices of :func:`scan` (callers that need no counter sets)."""
    return list(scan(sysfs_root, config, always).devices)
