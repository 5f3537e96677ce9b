"""What the fabric client hands the controller: frozen values.

These are our own shapes, independent of Redfish spelling (``wire.py``
parses that), so the controller's logic is testable without HTTP. The
client's errors (``FabricApiError`` and its kin) live in ``driver.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from driver.errors import FabricNotFound

TaskState = Literal["New", "Running", "Completed", "Exception"]
ConnectionState = Literal["Attaching", "Attached", "Detaching"]


@dataclass(frozen=True)
class HostAdapter:
    """A host adapter (an initiator endpoint): where a fabric device can appear."""

    endpoint: str
    fabric: str
    switch: str
    node: str
    adapter: str


@dataclass(frozen=True)
class FabricConnection:
    """A device bound to a host adapter (or on its way in or out)."""

    id: str
    uri: str
    device: str
    node: str
    adapter: str
    state: ConnectionState
    pci_bus_id: str  # "" until attached
    task_uri: str | None  # the open task, if any


@dataclass(frozen=True)
class FabricDevice:
    """A GPU or NIC PF in a fabric slot, with every adapter that can reach it."""

    id: str
    fabric: str
    switch: str
    kind: Literal["gpu", "nic"]
    model: str
    serial: str
    uuid: str  # GPUs: the NVML UUID it will have once attached; "" for NICs
    vendor_id: int
    device_id: int
    health: Literal["OK", "Warning", "Critical"]
    available: bool  # False: another tenant holds it (Status.State UnavailableOffline)
    in_use: bool
    adapters: tuple[HostAdapter, ...]
    connection: FabricConnection | None
    mac: str = ""  # NICs: the PF's permanent MAC address (lower case); "" for GPUs

    @property
    def identity(self) -> str:
        """What a node sees of this device once attached: GPU UUID or NIC MAC."""
        return self.uuid if self.kind == "gpu" else self.mac

    def adapter_on(self, node: str) -> tuple[HostAdapter, ...]:
        return tuple(a for a in self.adapters if a.node == node)


@dataclass(frozen=True)
class FabricInventory:
    devices: tuple[FabricDevice, ...]
    adapters: tuple[HostAdapter, ...]

    def device(self, ident: str) -> FabricDevice:
        for d in self.devices:
            if d.id == ident:
                return d
        raise FabricNotFound(404, "ResourceNotFound", f"no fabric device {ident!r}")


@dataclass(frozen=True)
class FabricTask:
    id: str
    uri: str
    state: TaskState
    operation: str  # "attach" | "detach"
    device: str
    connection_uri: str
    messages: tuple[str, ...]

    @property
    def done(self) -> bool:
        return self.state in ("Completed", "Exception")

    @property
    def failed(self) -> bool:
        return self.state == "Exception"


@dataclass(frozen=True)
class AttachResult:
    """``task`` is None when the device was already attached there (nothing to wait for)."""

    connection_uri: str
    task: FabricTask | None
