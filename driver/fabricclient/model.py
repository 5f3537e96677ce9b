"""What the fabric client hands the controller: frozen values.

These are our own shapes, independent of Redfish spelling (``wire.py``
parses that), so the controller's logic is testable without HTTP. The
client's errors (``FabricApiError`` and its kin) live in ``driver.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from driver.errors import FabricNotFound, FabricResourceBroken

TaskState = Literal[
    "New", "Starting", "Running", "Suspended", "Interrupted", "Pending", "Stopping",
    "Completed", "Killed", "Exception", "Service", "Cancelling", "Cancelled",
]  # fmt: skip
# The TaskStates after which nothing more happens, and those of them that end badly.
TASK_ENDED: frozenset[str] = frozenset({"Completed", "Killed", "Exception", "Cancelled"})
TASK_FAILED: frozenset[str] = frozenset({"Killed", "Exception", "Cancelled"})
# Failed: the manager gave up half-way (Status UnavailableOffline or Health
# Critical): never adopted as attached; a detach, or a new attach, clears it.
ConnectionState = Literal["Attaching", "Attached", "Detaching", "Failed"]
DeviceKind = Literal["gpu", "nic", "nvme", "cxlmem"]


@dataclass(frozen=True)
class HostAdapter:
    """A host adapter (an initiator endpoint): where a fabric device can appear."""

    endpoint: str
    fabric: str
    switch: str
    node: str  # the Kubernetes node (mapped, or the system's HostName); "" if unknown
    adapter: str  # the FabricAdapter Id (else the endpoint's Id)
    system_uuid: str = ""  # the ComputerSystem's UUID, to match a Node's systemUUID
    uri: str = ""  # the endpoint's URI ("": /redfish/v1/Fabrics/<fabric>/Endpoints/<endpoint>)
    # How many devices it can take: the vPPBs of the virtual switch its port is
    # bound to (driver.fabricclient.room); 0 when the fabric does not say.
    room: int = 0
    # The virtual switch whose vPPBs those are (its URI; "" when no room is said):
    # adapters bound to one share its room.
    vcs: str = ""

    def endpoint_uri(self) -> str:
        return self.uri or f"/redfish/v1/Fabrics/{self.fabric}/Endpoints/{self.endpoint}"


@dataclass(frozen=True)
class FabricConnection:
    """A device bound to a host adapter (or on its way in or out)."""

    id: str
    uri: str
    device: str
    node: str
    adapter: str
    state: ConnectionState
    pci_bus_id: str  # "" unless known (Redfish has none for a fabric-attached function)
    task_uri: str | None  # the open task, if any
    initiator: str = ""  # the initiator endpoint's URI, when the fabric names one


@dataclass(frozen=True)
class FabricDevice:
    """A GPU, NIC PF, NVMe drive or CXL memory device in a fabric slot, with every
    adapter that can reach it."""

    id: str
    fabric: str
    switch: str
    kind: DeviceKind
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
    capacity_bytes: int = 0  # NVMe drives and CXL memory: their size
    nqn: str = ""  # NVMe drives: the subsystem NQN, if the fabric names it
    uri: str = ""  # the target endpoint's URI ("": /redfish/v1/Fabrics/<fabric>/Endpoints/<id>)
    # Every binding (Connection, zone membership) of the device, ``connection`` first:
    # a device may sit in several Connections, to one host or to several.
    connections: tuple[FabricConnection, ...] = ()
    # CXL memory: the logical device (the GCXLID's part after ':', e.g. "0001"); the
    # LDs of one multi-logical device share a serial and differ here ("" if unknown).
    logical_device: str = ""

    def endpoint_uri(self) -> str:
        return self.uri or f"/redfish/v1/Fabrics/{self.fabric}/Endpoints/{self.id}"

    def bound_to(self, node: str) -> tuple[FabricConnection, ...]:
        """Its bindings to ``node`` (all of them, whichever adapter)."""
        return tuple(c for c in self.connections if c.node == node)

    @property
    def unique_identity(self) -> str:
        """What the pool's names are built from, in both shapes: :attr:`identity`,
        and for CXL memory on a logical device other than 0 of a multi-logical
        device ``<serial>:<LD id>`` (the LDs share the serial). LD 0 (and a
        single-logical device, which has no LD id) keeps the bare serial: the
        names published before the LDs were told apart, and the name a node
        computes itself from ``memX/serial`` (docs/fabric.md, "Logical devices")."""
        ld = self.logical_device.strip().lower()
        if self.kind == "cxlmem" and ld and ld.strip("0"):
            return f"{self.identity}:{ld}"
        return self.identity

    @property
    def identity(self) -> str:
        """What a node sees of this device once attached: GPU UUID, NIC MAC, NVMe
        serial, CXL memory device serial (as /sys/bus/cxl/devices/memX/serial)."""
        if self.kind == "gpu":
            return self.uuid
        return self.mac if self.kind == "nic" else self.serial

    def adapter_on(self, node: str) -> tuple[HostAdapter, ...]:
        return tuple(a for a in self.adapters if a.node == node)


@dataclass(frozen=True)
class NqnEndpoint:
    """An NVMe-oF endpoint (parsed, not attached: NVMe-oF attach is not offered)."""

    id: str
    fabric: str
    role: str
    nqn: str


@dataclass(frozen=True)
class FabricVolume:
    """An NVMe namespace a Storage connection grants to its initiators (NVMe-oF)."""

    uri: str
    capacity_bytes: int
    nguid: str
    initiators: tuple[str, ...]  # endpoint ids


@dataclass(frozen=True)
class FabricInventory:
    """``broken``: (URI, why) of each resource the read could not use; ``held_back``:
    device id -> why, for devices left out because something about them is in
    doubt (their endpoint, identity, or a binding that may name them is broken)."""

    devices: tuple[FabricDevice, ...]
    adapters: tuple[HostAdapter, ...]
    nqn_endpoints: tuple[NqnEndpoint, ...] = ()
    volumes: tuple[FabricVolume, ...] = ()
    broken: tuple[tuple[str, str], ...] = ()
    held_back: tuple[tuple[str, str], ...] = ()

    def device(self, ident: str) -> FabricDevice:
        for d in self.devices:
            if d.id == ident:
                return d
        why = dict(self.held_back).get(ident)
        if why is not None:
            raise FabricResourceBroken(f"fabric device {ident!r} is held back: {why}")
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
        return self.state in TASK_ENDED

    @property
    def failed(self) -> bool:
        return self.state in TASK_FAILED


class Arrival(Protocol):
    """The device a manager that picks devices (``FabricApi.picks_devices``)
    attached, as it names it."""

    @property
    def serial(self) -> str: ...
    def describe(self) -> str: ...


@dataclass(frozen=True)
class AttachResult:
    """``task`` is None when the attach needs no waiting (already attached there, or
    the fabric answered it at once); else ``task.uri`` is the operation's handle (a
    Task or a DSP0266 task monitor) that ``FabricApi.wait`` follows to its end.
    ``arrived``: the device a manager that picks devices chose (None otherwise)."""

    connection_uri: str
    task: FabricTask | None
    arrived: Arrival | None = None
