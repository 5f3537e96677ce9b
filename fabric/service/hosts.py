"""Host-side effects of attach and detach, applied to each node's simulated host.

On attach the device is hot-added behind the initiator's adapter, so it sits
under that adapter's root complex (and inherits its ``pcieRoot``); a GPU
enters the node's NVML mock state with the fabric's UUID and serial, an NVMe
drive gets its namespace and NQN, CXL memory its memdev (serial) and devdax
device; the simulated host appends the ``add`` uevents. Detach hot-removes it
(with a NIC's VFs) and the ``remove`` uevents follow. The host may refuse a
hot-remove (CXL memory in use: ``DeviceError`` saying why); nothing changes then.

Idempotency for resumed tasks: the address is chosen and stored *before*
the hot-add (``plan``), and ``add`` does nothing if that address already
exists on the host. A crash between the device appearing and its uevent
being written can lose that one event; the device itself is never doubled.

A hot-add that fails half-way is undone (``add_or_undo``); when the undo
fails too, the caller learns it, since part of the device may still be on
the host (the service then marks the connection failed: ``core.py``).

Concurrency: called only from the service's worker thread; ``SimHost`` is
not thread-safe and is opened per call (cheap: one small JSON file).
"""

from __future__ import annotations

import logging

from driver.errors import DeviceError
from fabric.service.inventory import Initiator, Target
from fabric.simhost.host import SimHost
from fabric.simhost.topology import CxlMemory, Gpu, Nic, Nvme

log = logging.getLogger(__name__)


def _host(initiator: Initiator) -> SimHost:
    return SimHost.open(initiator.host_dir)


def plan(initiator: Initiator) -> str:
    """The address the device will get behind the initiator's adapter."""
    return _host(initiator).free_bdf(initiator.adapter)


def _endpoint(target: Target, bdf: str) -> Gpu | Nic | Nvme | CxlMemory:
    if target.kind == "gpu":
        return Gpu(bdf, target.model, uuid=target.uuid, serial=target.serial)
    if target.kind == "nvme":
        return Nvme(bdf, target.model, target.serial, (target.capacity_bytes,), nqn=target.nqn)
    if target.kind == "cxlmem":
        return CxlMemory(bdf, target.serial_number, target.capacity_bytes, target.model)
    return Nic(
        bdf, target.netdev, total_vfs=target.total_vfs, num_vfs=target.num_vfs, mac=target.mac
    )


def add(initiator: Initiator, target: Target, bdf: str) -> list[str]:
    """Hot-add ``target`` at ``bdf``; returns the addresses that appeared (none if present)."""
    host = _host(initiator)
    if host.tree.exists(bdf):
        log.info("%s already present at %s on %s; not added again", target.id, bdf, host.name)
        return []
    bdfs = host.hot_add(initiator.adapter, _endpoint(target, bdf))
    log.info("hot-added %s on %s behind %s: %s", target.id, host.name, initiator.adapter, bdfs)
    return bdfs


def add_or_undo(initiator: Initiator, target: Target, bdf: str) -> tuple[str, bool]:
    """Hot-add ``target`` at ``bdf``, and hot-remove it again if that fails.

    Returns ``(problem, undone)``: ``("", True)`` once added; a problem and
    True when the add failed and nothing of it is left; a problem and False
    when the undo failed too (part of the device may still be there)."""
    try:
        add(initiator, target, bdf)
    except (OSError, DeviceError) as exc:
        problem = f"hot-add of {target.id} on {initiator.node} failed: {exc}"
    else:
        return "", True
    try:
        remove(initiator, target, bdf)
    except (OSError, DeviceError) as exc:
        log.error("%s; undoing it failed too: %s", problem, exc)
        return f"{problem}; undoing it failed too: {exc}", False
    return problem, True


def remove(initiator: Initiator, target: Target, bdf: str) -> list[str]:
    """Hot-remove the device at ``bdf``; returns the addresses that went (none if absent).

    Raises ``DeviceError`` when the host refuses (CXL memory in use): nothing changed."""
    host = _host(initiator)
    if not bdf or not host.tree.exists(bdf):
        log.info("%s not present at %r on %s; nothing to remove", target.id, bdf, host.name)
        return []
    try:
        gone = host.hot_remove(bdf)
    except DeviceError as exc:
        raise DeviceError(f"{host.name} refused to release {target.id}: {exc}") from exc
    log.info("hot-removed %s from %s: %s", target.id, host.name, gone)
    return gone


def mark_memory_in_use(initiator: Initiator, bdf: str, in_use: bool) -> None:
    """Mark the attached CXL memory at ``bdf`` in use on its host (a fault to inject:
    the host then refuses its hot-remove)."""
    _host(initiator).set_memory_in_use(bdf, in_use)
