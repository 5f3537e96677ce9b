"""The fabric's static inventory: fabrics, switches, wiring and slotted devices.

The topology file (YAML or JSON) is a trust boundary, so it is parsed with
pydantic (``TopologyFile``) and turned into frozen dataclasses that the rest
of the service shares read-only. Each switch has upstream ports wired to a
host adapter on a node (with that node's simulated-host directory) and
downstream slots that hold GPUs, NIC PFs, NVMe drives or (on a CXL fabric)
CXL Type 3 memory expanders. Identifiers (device ids, port
ids, initiator endpoint ids) become Redfish ``Id`` values, so they are
restricted to URL-safe characters and must be unique across the file.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from driver.errors import ConfigError
from fabric.simhost.sysfs_tree import NVIDIA, PCI_DEVICE_IDS, derived_mac

Ident = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
_NS = uuidlib.UUID("0c3b2d54-7a55-4f0e-9c55-3f1f3e0b7a11")
MELLANOX, CX6DX = 0x15B3, 0x101D
# Simulated Samsung PM1733 drives and CMM-D memory expanders (as fabric/simhost's).
SAMSUNG, PM1733, CMM_D = 0x144D, 0xA824, 0xA800
# PCI class codes (base, sub, prog-if) per kind: what the host's config space says.
CLASS_CODES = {"gpu": 0x030200, "nic": 0x020000, "nvme": 0x010802, "cxlmem": 0x050210}
Kind = Literal["gpu", "nic", "nvme", "cxlmem"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class GpuSlot(_Strict):
    kind: Literal["gpu"] = "gpu"
    id: Ident
    model: str = "H100-SXM5-80GB"
    uuid: str = ""
    serial: str = ""

    @model_validator(mode="after")
    def _known_model(self) -> GpuSlot:
        if self.model not in PCI_DEVICE_IDS:
            raise ValueError(f"unknown GPU model {self.model!r}; known: {sorted(PCI_DEVICE_IDS)}")
        return self


class NicSlot(_Strict):
    kind: Literal["nic"] = "nic"
    id: Ident
    netdev: str
    model: str = "ConnectX-6 Dx"
    serial: str = ""
    total_vfs: int = Field(default=8, ge=0, le=64, alias="totalVfs")
    num_vfs: int = Field(default=8, ge=0, le=64, alias="numVfs")
    mac: Annotated[str, Field(pattern=r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")] = ""


class NvmeSlot(_Strict):
    kind: Literal["nvme"] = "nvme"
    id: Ident
    model: str = "SAMSUNG MZWLR3T8HCLS-00A07"
    serial: str = Field(default="", max_length=20)  # the NVMe serial field is 20 bytes
    capacity_bytes: int = Field(default=3_840_755_982_336, gt=0, alias="capacityBytes")
    nqn: str = ""  # subsystem NQN; derived from the serial when empty


class CxlMemSlot(_Strict):
    kind: Literal["cxlmem"] = "cxlmem"
    id: Ident
    model: str = "CXL Type 3 memory expander"
    serial: int = Field(default=0, ge=0, lt=1 << 64)  # device serial (EUI-64); 0: derived
    memory_mib: int = Field(default=256 * 1024, gt=0, alias="memoryMiB")
    # A multi-logical device (MLD) when above 1: that many LDs (ids 0..n-1), each
    # its own endpoint ``<id>-ld<n>`` with an equal share of the memory, attached
    # on its own; all share the serial (CXL 2.0 allows up to 16 LDs).
    logical_devices: int = Field(default=1, ge=1, le=16, alias="logicalDevices")


Slot = GpuSlot | NicSlot | NvmeSlot | CxlMemSlot


class UpstreamSpec(_Strict):
    port: Ident
    node: str
    adapter: str
    host_dir: Path = Field(alias="hostDir")
    endpoint: Ident | None = None  # default "<node>-<adapter>"
    # How many devices the adapter can take: the vPPBs of the virtual switch its
    # port is bound to (fabric/service/vcs.py); none: not limited, not served.
    vppbs: int | None = Field(default=None, ge=1)


class SlotSpec(_Strict):
    port: Ident
    device: Annotated[Slot, Field(discriminator="kind")] | None = None


class SwitchSpec(_Strict):
    id: Ident
    upstream: list[UpstreamSpec]
    slots: list[SlotSpec]


class FabricSpec(_Strict):
    id: Ident
    type: Literal["PCIe", "CXL"] = "PCIe"
    switches: list[SwitchSpec]


class TopologyFile(_Strict):
    fabrics: list[FabricSpec] = Field(min_length=1)


# ---- the model the service uses ------------------------------------------------


@dataclass(frozen=True)
class Initiator:
    id: str  # endpoint id
    fabric: str
    switch: str
    port: str
    node: str
    adapter: str
    host_dir: Path
    vppbs: int | None = None  # its virtual switch's vPPBs (None: no VCS served)


@dataclass(frozen=True)
class Target:
    id: str  # endpoint id == device id
    fabric: str
    switch: str
    port: str
    kind: Kind
    model: str
    serial: str  # cxlmem: the EUI-64 as a GCXLID writes it (4C-1D-96-FF-FE-DD-D8-35)
    uuid: str  # GPUs only
    vendor_id: int
    device_id: int
    netdev: str = ""
    total_vfs: int = 0
    num_vfs: int = 0
    mac: str = ""  # NICs: the PF's permanent MAC, the identity nodes see in sysfs
    capacity_bytes: int = 0  # nvme, cxlmem
    nqn: str = ""  # nvme: the subsystem NQN
    serial_number: int = 0  # cxlmem: the device serial as the host's memX/serial holds it
    # cxlmem: the logical device (the GCXLID's LD id) and how many the physical
    # device has (1: a single-logical device); ``pcie`` is that device's id
    # (the PCIeDevice every LD of one MLD shares; "": the endpoint's own id).
    ld: int = 0
    lds: int = 1
    pcie: str = ""

    @property
    def pcie_id(self) -> str:
        """The id of the PCIeDevice behind the endpoint (an MLD's, for its LDs)."""
        return self.pcie or self.id

    @property
    def class_code(self) -> int:
        return CLASS_CODES[self.kind]

    @property
    def chassis(self) -> str:
        """The enclosure (one per switch) that holds the device."""
        return f"{self.fabric}-{self.switch}"


@dataclass(frozen=True)
class Inventory:
    fabrics: dict[str, str]  # id -> FabricType
    switches: dict[str, tuple[str, ...]]  # "<fabric>/<switch>" -> port ids in order
    initiators: dict[str, Initiator]
    targets: dict[str, Target]

    def endpoints(self, fabric: str) -> list[str]:
        ini = [i.id for i in self.initiators.values() if i.fabric == fabric]
        return ini + [t.id for t in self.targets.values() if t.fabric == fabric]


def eui64(serial: int) -> str:
    """A 64-bit device serial as GCXLIDs and PCIe DSNs write it: 4C-1D-96-FF-FE-DD-D8-35."""
    return "-".join(f"{b:02X}" for b in serial.to_bytes(8, "big"))


def mld_targets(fabric: str, switch: str, port: str, d: CxlMemSlot) -> list[Target]:
    """The endpoints of a CXL memory device: itself, or one per LD of an MLD
    (``<id>-ld<n>``, the memory split evenly, one serial)."""
    number = d.serial or uuidlib.uuid5(_NS, f"{fabric}/{d.id}").int >> 64
    n = d.logical_devices
    one = Target(
        d.id, fabric, switch, port, "cxlmem", d.model, eui64(number), "", SAMSUNG, CMM_D,
        capacity_bytes=(d.memory_mib // n) << 20, serial_number=number, lds=n,
    )  # fmt: skip
    if n == 1:
        return [one]
    return [replace(one, id=f"{d.id}-ld{k}", ld=k, pcie=d.id) for k in range(n)]


def _target(fabric: str, switch: str, port: str, d: GpuSlot | NicSlot | NvmeSlot) -> Target:
    ident = uuidlib.uuid5(_NS, f"{fabric}/{d.id}")
    serial = d.serial or f"FAB{ident.int % 10**10:010d}"
    if isinstance(d, NvmeSlot):
        nqn = d.nqn or f"nqn.1994-11.com.samsung:nvme:PM1733:2.5-inch:{serial}"
        return Target(
            d.id, fabric, switch, port, "nvme", d.model, serial, "", SAMSUNG, PM1733,
            capacity_bytes=d.capacity_bytes, nqn=nqn,
        )  # fmt: skip
    if isinstance(d, GpuSlot):
        uid = d.uuid or f"GPU-{ident}"
        dev_id = PCI_DEVICE_IDS[d.model][0]
        return Target(d.id, fabric, switch, port, "gpu", d.model, serial, uid, NVIDIA, dev_id)
    return Target(
        d.id, fabric, switch, port, "nic", d.model, serial, "", MELLANOX, CX6DX,
        d.netdev, d.total_vfs, d.num_vfs, d.mac or derived_mac(f"{fabric}/{d.id}"),
    )  # fmt: skip


def build(spec: TopologyFile, base: Path) -> Inventory:
    """The inventory of ``spec``; relative host directories are taken from ``base``."""
    fabrics: dict[str, str] = {}
    switches: dict[str, tuple[str, ...]] = {}
    initiators: dict[str, Initiator] = {}
    targets: dict[str, Target] = {}
    adapters: set[tuple[str, str]] = set()
    for f in spec.fabrics:
        if f.id in fabrics:
            raise ConfigError(f"fabric {f.id!r} defined twice")
        fabrics[f.id] = f.type
        for sw in f.switches:
            ports = [u.port for u in sw.upstream] + [s.port for s in sw.slots]
            if len(set(ports)) != len(ports) or f"{f.id}/{sw.id}" in switches:
                raise ConfigError(f"switch {f.id}/{sw.id}: duplicate switch or port id")
            switches[f"{f.id}/{sw.id}"] = tuple(ports)
            for u in sw.upstream:
                eid = u.endpoint or f"{u.node}-{u.adapter}"
                if (u.node, u.adapter) in adapters or eid in initiators or eid in targets:
                    raise ConfigError(f"adapter {u.node}/{u.adapter} (endpoint {eid}) wired twice")
                adapters.add((u.node, u.adapter))
                hdir = u.host_dir if u.host_dir.is_absolute() else base / u.host_dir
                initiators[eid] = Initiator(
                    eid, f.id, sw.id, u.port, u.node, u.adapter, hdir, u.vppbs
                )
            for s in sw.slots:
                if s.device is None:
                    continue
                if s.device.id in targets or s.device.id in initiators:
                    raise ConfigError(f"device id {s.device.id!r} used twice")
                if s.device.kind == "cxlmem" and f.type != "CXL":
                    raise ConfigError(
                        f"fabrics[{f.id}].switches[{sw.id}].slots[{s.port}]: CXL memory "
                        f"{s.device.id!r} needs a fabric of type CXL, not {f.type}"
                    )
                if isinstance(s.device, CxlMemSlot):
                    for t in mld_targets(f.id, sw.id, s.port, s.device):
                        if t.id in targets or t.id in initiators:
                            raise ConfigError(f"device id {t.id!r} used twice")
                        targets[t.id] = t
                else:
                    targets[s.device.id] = _target(f.id, sw.id, s.port, s.device)
    return Inventory(fabrics, switches, initiators, targets)


def load(path: Path) -> Inventory:
    """Read and validate a topology file (``.json``, else YAML)."""
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        spec = TopologyFile.model_validate(data)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        # pydantic's ValidationError is a ValueError.
        kind = "invalid" if isinstance(exc, ValidationError) else "unreadable"
        raise ConfigError(f"fabric topology {path} is {kind}: {exc}") from exc
    return build(spec, path.parent)
