"""What a simulated host's PCI tree holds.

Frozen dataclasses are the model; :class:`TopologySpec` (pydantic) is the
trust boundary for topologies loaded from YAML/JSON files. A root complex
(``pci<domain>:<bus>``, with a NUMA node) has root ports; a root port holds
one endpoint, a PCIe switch, or nothing - an empty named root port is a
fabric *adapter*, where fabric-attached devices appear later. NVMe drives may
sit anywhere an endpoint may; CXL memory only arrives through an adapter
(hot-add), as a fabric's pooled memory does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def bdf_parts(bdf: str) -> tuple[int, int, int, int]:
    """ "0000:3b:00.0" -> (domain, bus, device, function)."""
    if not BDF_RE.match(bdf):
        raise ValueError(f"not a lowercase PCI address: {bdf!r}")
    dom, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def make_bdf(domain: int, bus: int, devfn: int) -> str:
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


@dataclass(frozen=True)
class Gpu:
    bdf: str
    model: str = "H100-SXM5-80GB"
    uuid: str = ""  # empty: derived from the host name and BDF
    serial: str = ""


@dataclass(frozen=True)
class Nic:
    """A NIC physical function with SR-IOV virtual functions."""

    bdf: str
    netdev: str
    vendor_id: int = 0x15B3  # Mellanox
    device_id: int = 0x101D  # ConnectX-6 Dx
    vf_device_id: int = 0x101E
    total_vfs: int = 8
    num_vfs: int = 8
    driver: str = "mlx5_core"
    vf_offset: int = 2  # first VF's routing-id offset from the PF
    vf_stride: int = 1
    mac: str = ""  # the PF's permanent MAC; derived from the address when empty
    speed_mbps: int = 100_000  # link speed, as net/<if>/speed reports it (Mb/s)


@dataclass(frozen=True)
class Nvme:
    """An NVMe drive (class 0x010802) with one namespace per entry of ``namespaces``
    (bytes each). ``serial`` empty: derived from the host name and address."""

    bdf: str
    model: str = "SAMSUNG MZWLR3T8HCLS-00A07"
    serial: str = ""
    namespaces: tuple[int, ...] = (3_840_755_982_336,)
    firmware: str = "MPK7525Q"
    nqn: str = ""  # subsystem NQN; derived from the serial when empty


@dataclass(frozen=True)
class CxlMemory:
    """A CXL Type 3 memory expander (class 0x050210) whose RAM the host maps in
    devdax mode. ``serial`` is the device serial (an EUI-64 as a number)."""

    bdf: str
    serial: int
    size: int = 256 << 30  # bytes of volatile capacity
    model: str = "CXL Type 3 memory expander"


Endpoint = Gpu | Nic | Nvme


@dataclass(frozen=True)
class Switch:
    bdf: str  # upstream port
    devices: tuple[Endpoint, ...]


@dataclass(frozen=True)
class RootPort:
    bdf: str
    child: Endpoint | Switch | None = None
    adapter: str = ""  # non-empty: a fabric adapter of that name


@dataclass(frozen=True)
class RootComplex:
    domain: int
    bus: int
    numa_node: int
    ports: tuple[RootPort, ...]

    @property
    def name(self) -> str:
        return f"pci{self.domain:04x}:{self.bus:02x}"


@dataclass(frozen=True)
class Topology:
    name: str
    roots: tuple[RootComplex, ...]


# ---- YAML/JSON boundary -----------------------------------------------------

Bdf = Annotated[str, Field(pattern=BDF_RE.pattern)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    kind: Literal["gpu"] = "gpu"
    bdf: Bdf
    model: str = "H100-SXM5-80GB"


class NicSpec(_Strict):
    kind: Literal["nic"] = "nic"
    bdf: Bdf
    netdev: str
    total_vfs: int = Field(default=8, ge=0, le=64)
    num_vfs: int = Field(default=8, ge=0, le=64)
    speed_mbps: int = Field(default=100_000, ge=-1)  # -1: link down, as the kernel says


class NvmeSpec(_Strict):
    kind: Literal["nvme"] = "nvme"
    bdf: Bdf
    model: str = "SAMSUNG MZWLR3T8HCLS-00A07"
    serial: str = Field(default="", max_length=20)  # the NVMe serial field is 20 bytes
    namespaces: list[Annotated[int, Field(gt=0)]] = Field(default=[3_840_755_982_336], min_length=1)


EndpointSpec = Annotated[GpuSpec | NicSpec | NvmeSpec, Field(discriminator="kind")]


class SwitchSpec(_Strict):
    kind: Literal["switch"] = "switch"
    bdf: Bdf
    devices: list[EndpointSpec]


class PortSpec(_Strict):
    bdf: Bdf
    adapter: str = ""
    child: (
        Annotated[GpuSpec | NicSpec | NvmeSpec | SwitchSpec, Field(discriminator="kind")] | None
    ) = None


class RootSpec(_Strict):
    domain: int = 0
    bus: int = Field(ge=0, le=255)
    numa_node: int = 0
    ports: list[PortSpec]


class TopologySpec(_Strict):
    name: str
    roots: list[RootSpec]

    def to_topology(self) -> Topology:
        def endpoint(s: GpuSpec | NicSpec | NvmeSpec) -> Endpoint:
            if isinstance(s, GpuSpec):
                return Gpu(s.bdf, s.model)
            if isinstance(s, NvmeSpec):
                return Nvme(s.bdf, s.model, s.serial, tuple(s.namespaces))
            return Nic(
                s.bdf, s.netdev, total_vfs=s.total_vfs, num_vfs=s.num_vfs, speed_mbps=s.speed_mbps
            )

        def child(s: GpuSpec | NicSpec | NvmeSpec | SwitchSpec | None) -> Endpoint | Switch | None:
            if s is None:
                return None
            if isinstance(s, SwitchSpec):
                return Switch(s.bdf, tuple(endpoint(d) for d in s.devices))
            return endpoint(s)

        return Topology(
            self.name,
            tuple(
                RootComplex(
                    r.domain,
                    r.bus,
                    r.numa_node,
                    tuple(RootPort(p.bdf, child(p.child), p.adapter) for p in r.ports),
                )
                for r in self.roots
            ),
        )
