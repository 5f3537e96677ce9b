"""What a target endpoint is, read from the standard places: kind and identity.

Why a module: the fact the controller needs of a fabric device (which kind
it is and what the node will see of it once attached) is spread over the
resources an Endpoint links, and every fabric manager links them a little
differently. This module reads, for one endpoint's target entities
(``ConnectedEntities[]`` with ``EntityRole`` Target or Both):

- the kind from ``EntityType``: ``Processor`` with ``ProcessorType`` GPU,
  ``NetworkController``, ``Drive`` with ``Protocol`` NVMe, ``CXLDevice``
  (a CXL logical device with memory); when no entity says, the PCIe
  function's ``ClassCode`` (or ``DeviceClass``). A GPU wins over the other
  kinds (a CXL Type 2 GPU also lists its logical device and memory);
- model and serial from that resource, else its PCIeDevice; vendor and
  device ids from its PCIeFunction, else the entity's ``EntityPciId``;
- the identity: a GPU's ``Processor.UUID`` (as NVML spells it,
  ``GPU-<uuid>``), a NIC's ``PermanentMACAddress`` (else ``MACAddress``,
  else its port's ``AssociatedMACAddresses``), an NVMe drive's
  ``SerialNumber`` (and NQN), a CXL memory device's serial: the EUI-64 of
  its ``GCXLID`` written as Linux shows ``/sys/bus/cxl/devices/memX/serial``
  (``0x`` and 16 hex digits), with ``MemorySizeMiB`` as capacity, and its
  logical device (the GCXLID's part after ``:``), which tells the LDs of one
  multi-logical device apart (they share the serial).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from driver.errors import FabricMalformed, FabricNotFound
from driver.fabricclient import wire
from driver.fabricclient.links import Links, parse
from driver.fabricclient.model import DeviceKind

NAMED = {"Processor", "NetworkController", "Drive", "CXLDevice", "Switch", "MemoryChunk"}
RANK: tuple[DeviceKind, ...] = ("gpu", "nic", "nvme", "cxlmem")  # which kind wins
# PCI base class (and subclass) -> kind, for a function no entity type names.
CLASS_KIND: dict[int, DeviceKind] = {0x03: "gpu", 0x12: "gpu", 0x02: "nic", 0x0108: "nvme",
                                     0x0502: "cxlmem"}  # fmt: skip
DEVICE_CLASS_KIND: dict[str, DeviceKind] = {
    "DisplayController": "gpu", "ProcessingAccelerators": "gpu",
    "NetworkController": "nic", "MemoryController": "cxlmem",
}  # fmt: skip


@dataclass(frozen=True)
class Identity:
    kind: DeviceKind
    model: str = ""
    serial: str = ""
    uuid: str = ""
    mac: str = ""
    vendor_id: int = 0
    device_id: int = 0
    capacity_bytes: int = 0
    nqn: str = ""
    logical_device: str = ""


def nvml_uuid(uuid: str) -> str:
    """A Redfish UUID as NVML spells a GPU's: ``GPU-`` and lower case."""
    bare = uuid.strip().lower().removeprefix("gpu-")
    return f"GPU-{bare}" if bare else ""


def cxl_serial(gcxlid: str) -> str:
    """The device serial of a GCXLID (``4C-1D-...-35:0001``) as Linux shows it."""
    eui = gcxlid.split(":", 1)[0].replace("-", "")
    try:
        return f"{int(eui, 16):#x}" if eui else ""
    except ValueError:
        return eui.lower()


def cxl_logical_device(gcxlid: str) -> str:
    """The logical device part of a GCXLID (``...-35:0001`` -> ``0001``), or ""."""
    return gcxlid.partition(":")[2].strip().lower()


def class_kind(fn: wire.Device) -> DeviceKind | None:
    try:
        code = int(fn.class_code or "", 16)
    except ValueError:
        return DEVICE_CLASS_KIND.get(fn.device_class or "")
    return CLASS_KIND.get(code >> 8) or CLASS_KIND.get(code >> 16)


def entity_kind(entity: wire.Entity, body: wire.Device) -> DeviceKind | None:
    t = entity.type
    if t == "Processor":
        return "gpu" if body.processor_type == "GPU" else None
    if t == "NetworkController":
        return "nic"
    if t == "Drive":
        return "nvme" if (body.protocol or "").lower() == "nvme" else None
    if t == "CXLDevice":  # a logical device with memory (Type 3, or a Type 2's)
        has_mem = not body.semantics or "CXLmem" in body.semantics
        return "cxlmem" if body.memory_size_mib and has_mem else None
    if t in ("PCIeFunction", "PCIeDevice"):
        return class_kind(body)
    return None


async def function(links: Links, body: wire.Device) -> wire.Device | None:
    """The PCIe function of a device resource (or the resource, if it is one)."""
    if body.class_code or body.vendor_id:
        return body
    ref = body.links.pcie_functions[0] if body.links.pcie_functions else body.links.pcie_function
    if ref is not None:
        return await links.model(wire.Device, ref.odata_id)
    fns = body.functions
    if fns is None and body.links.pcie_device is not None:
        fns = (await links.model(wire.Device, body.links.pcie_device.odata_id)).functions
    if fns is None:
        return None
    first = await links.first_member(fns.odata_id)
    return None if first is None else parse(wire.Device, first, fns.odata_id)


async def _mac(links: Links, body: wire.Device) -> str:
    fn = body
    if body.ethernet is None and body.device_functions is not None:
        first = await links.first_member(body.device_functions.odata_id)
        fn = parse(wire.Device, first, body.device_functions.odata_id) if first else body
    eth = fn.ethernet or wire.Ethernet()
    mac = eth.permanent_mac or eth.mac or ""
    if not mac and body.ports is not None:
        port = await links.first_member(body.ports.odata_id)
        if port is not None:
            macs = parse(wire.Device, port, body.ports.odata_id).ethernet or wire.Ethernet()
            mac = next(iter(macs.associated_macs), "")
    return mac.lower()


async def identify(links: Links, ep: wire.Endpoint) -> Identity | None:
    """The endpoint's device, or None when it is no kind we attach; a link to a
    resource the fabric does not have is :class:`FabricMalformed` naming the endpoint."""
    try:
        return await _identify(links, ep)
    except FabricNotFound as exc:
        raise FabricMalformed(
            f"fabric endpoint {ep.odata_id} links a missing resource: {exc}"
        ) from exc


async def _identify(links: Links, ep: wire.Endpoint) -> Identity | None:
    found: dict[DeviceKind, tuple[wire.Entity, wire.Device]] = {}
    for entity in ep.entities:
        if entity.role not in ("Target", "Both") or entity.link is None:
            continue
        body = await links.model(wire.Device, entity.link.odata_id, ep.odata_id)
        kind = entity_kind(entity, body)
        if kind is None and entity.type not in NAMED:  # no entity type says: the class
            fn = await function(links, body)
            kind = class_kind(fn) if fn is not None else None
        if kind is not None:
            found.setdefault(kind, (entity, body))
    kind = next((k for k in RANK if k in found), None)
    if kind is None:
        return None
    entity, body = found[kind]
    fn = await function(links, body)
    pcie = body
    ref = (fn.links.pcie_device if fn else None) or body.links.pcie_device
    if ref is not None and not (body.model and body.serial):
        pcie = await links.model(wire.Device, ref.odata_id)
    pci = entity.pci_id or wire.PciId()
    ident = Identity(
        kind, body.model or pcie.model or "", body.serial or pcie.serial or "",
        vendor_id=int((fn.vendor_id if fn else None) or pci.vendor_id, 16),
        device_id=int((fn.device_id if fn else None) or pci.device_id, 16),
    )  # fmt: skip
    if kind == "gpu":
        return replace(ident, uuid=nvml_uuid(body.uuid or ""))
    if kind == "nic":
        return replace(ident, mac=await _mac(links, body))
    if kind == "nvme":
        nqn = wire.durable(body.identifiers, "NQN") or wire.durable(ep.identifiers, "NQN")
        return replace(ident, capacity_bytes=body.capacity_bytes or 0, nqn=nqn)
    # The endpoint's own name of the LD first: it names the LD bound at this
    # endpoint (DMTF's public-cxl: T5's logical device resource repeats T3's
    # GCXLID, ...:0001, while T5's endpoint names LD 0007); else the resource's.
    gcxlid = wire.durable(entity.identifiers, "GCXLID") or wire.durable(body.identifiers, "GCXLID")
    size = (body.memory_size_mib or 0) << 20
    return replace(ident, serial=cxl_serial(gcxlid), capacity_bytes=size,
                   logical_device=cxl_logical_device(gcxlid))  # fmt: skip
