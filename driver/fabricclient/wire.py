"""Pydantic models of the standard Redfish bodies we read: the client's trust boundary.

Only the properties the client uses are declared, each where DMTF's schema
puts it (CSDL in ``../shared/redfish/csdl``); everything else is ignored,
so any conformant fabric manager parses. No ``Oem`` part is read: a fact
the schemas have no property for is not asked of the fabric. Properties the
schema lets a service leave out or send as null (``Status.Health``,
``Connection.Links.TargetEndpoints``) default instead of failing. Parsing
into the frozen values of ``model.py`` happens in ``inventory.py`` and
``operations.py``.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

M = TypeVar("M", bound=BaseModel)
HEX_ID = r"^(0[xX])?[0-9a-fA-F]{1,8}$"  # what the client reads as an int, base 16


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


def _links(value: Any) -> Any:
    """A single link where a list is expected (some services do): a one-item list;
    null (some services send it for an empty list): an empty one."""
    if value is None:
        return []
    return [value] if isinstance(value, dict) else value


class Link(_Wire):
    odata_id: str = Field(alias="@odata.id")


Links = list[Link]


class Identifier(_Wire):
    name: str = Field(default="", alias="DurableName")
    format: str = Field(default="", alias="DurableNameFormat")


def durable(ids: list[Identifier], fmt: str) -> str:
    return next((i.name for i in ids if i.format == fmt and i.name), "")


class Status(_Wire):
    state: str | None = Field(default=None, alias="State")
    health: Literal["OK", "Warning", "Critical"] | None = Field(default=None, alias="Health")


class Collection(_Wire):
    members: list[dict[str, Any]] = Field(alias="Members", default_factory=list)


class ExpandQuery(_Wire):
    no_links: bool = Field(default=False, alias="NoLinks")
    expand_all: bool = Field(default=False, alias="ExpandAll")


class ProtocolFeatures(_Wire):
    expand: ExpandQuery | None = Field(default=None, alias="ExpandQuery")


class RootLinks(_Wire):
    sessions: Link | None = Field(default=None, alias="Sessions")


class ServiceRoot(_Wire):
    fabrics: Link | None = Field(default=None, alias="Fabrics")
    event_service: Link | None = Field(default=None, alias="EventService")
    session_service: Link | None = Field(default=None, alias="SessionService")
    features: ProtocolFeatures = Field(
        default_factory=ProtocolFeatures, alias="ProtocolFeaturesSupported"
    )
    links: RootLinks = Field(default_factory=RootLinks, alias="Links")

    def expand_query(self) -> str:
        """The ``$expand`` that inlines a collection's members; "" when not offered."""
        e = self.features.expand
        if e is None:
            return ""
        return "." if e.no_links else ("*" if e.expand_all else "")


class Fabric(_Wire):
    odata_id: str = Field(default="", alias="@odata.id")
    id: str = Field(alias="Id")
    endpoints: Link | None = Field(default=None, alias="Endpoints")
    connections: Link | None = Field(default=None, alias="Connections")
    switches: Link | None = Field(default=None, alias="Switches")
    zones: Link | None = Field(default=None, alias="Zones")


class PciId(_Wire):
    vendor_id: str = Field(default="0x0", alias="VendorId", pattern=HEX_ID)
    device_id: str = Field(default="0x0", alias="DeviceId", pattern=HEX_ID)


class Entity(_Wire):
    """``Endpoint.ConnectedEntities[]``: where an endpoint's role and kind live."""

    type: str = Field(default="", alias="EntityType")
    role: str = Field(default="", alias="EntityRole")
    link: Link | None = Field(default=None, alias="EntityLink")
    pci_id: PciId | None = Field(default=None, alias="EntityPciId")
    identifiers: list[Identifier] = Field(default_factory=list, alias="Identifiers")


class EndpointLinks(_Wire):
    connected_ports: Links = Field(default_factory=list, alias="ConnectedPorts")
    local_ports: Links = Field(default_factory=list, alias="LocalPorts")  # Endpoint v1_7_0 on
    ports_deprecated: Links = Field(default_factory=list, alias="Ports")  # before v1_7_0
    zones: Links = Field(default_factory=list, alias="Zones")
    connections: Links = Field(default_factory=list, alias="Connections")

    listed = field_validator(
        "connected_ports", "local_ports", "ports_deprecated", "zones", "connections", mode="before"
    )(_links)

    @property
    def ports(self) -> Links:
        """The endpoint's own ports: ``LocalPorts``, else the deprecated ``Ports``."""
        return self.local_ports or self.ports_deprecated


class Endpoint(_Wire):
    odata_id: str = Field(alias="@odata.id")
    id: str = Field(alias="Id")
    protocol: str = Field(default="", alias="EndpointProtocol")
    entities: list[Entity] = Field(default_factory=list, alias="ConnectedEntities")
    identifiers: list[Identifier] = Field(default_factory=list, alias="Identifiers")
    status: Status = Field(default_factory=Status, alias="Status")
    links: EndpointLinks = Field(default_factory=EndpointLinks, alias="Links")

    listed = field_validator("entities", "identifiers", mode="before")(_links)

    def role(self) -> str:
        """Initiator, Target or Both: the first connected entity's ``EntityRole``."""
        return next((e.role for e in self.entities if e.role), "")


class ConnectionLinks(_Wire):
    initiators: Links = Field(default_factory=list, alias="InitiatorEndpoints")
    targets: Links = Field(default_factory=list, alias="TargetEndpoints")
    initiator_groups: Links = Field(default_factory=list, alias="InitiatorEndpointGroups")
    target_groups: Links = Field(default_factory=list, alias="TargetEndpointGroups")

    listed = field_validator(
        "initiators", "targets", "initiator_groups", "target_groups", mode="before"
    )(_links)


class EndpointGroupLinks(_Wire):
    endpoints: Links = Field(default_factory=list, alias="Endpoints")


class EndpointGroup(_Wire):
    """Its members: ``Links.Endpoints`` (v1_3_0 on), else the deprecated ``Endpoints``."""

    links: EndpointGroupLinks = Field(default_factory=EndpointGroupLinks, alias="Links")
    endpoints_deprecated: Links = Field(default_factory=list, alias="Endpoints")

    def members(self) -> Links:
        return self.links.endpoints or self.endpoints_deprecated


class VolumeInfo(_Wire):
    volume: Link | None = Field(default=None, alias="Volume")


class Connection(_Wire):
    odata_id: str = Field(alias="@odata.id")
    odata_type: str = Field(default="", alias="@odata.type")
    id: str = Field(alias="Id")
    type: str | None = Field(default=None, alias="ConnectionType")
    status: Status = Field(default_factory=Status, alias="Status")
    links: ConnectionLinks = Field(default_factory=ConnectionLinks, alias="Links")
    volumes: list[VolumeInfo] = Field(default_factory=list, alias="VolumeInfo")


class ZoneLinks(_Wire):
    endpoints: Links = Field(default_factory=list, alias="Endpoints")


class Zone(_Wire):
    odata_id: str = Field(alias="@odata.id")
    id: str = Field(alias="Id")
    links: ZoneLinks = Field(default_factory=ZoneLinks, alias="Links")
    etag: str | None = Field(default=None, alias="@odata.etag")


class SwitchCxl(_Wire):
    virtual_cxl_switches: Link | None = Field(default=None, alias="VirtualCXLSwitches")


class Switch(_Wire):
    odata_id: str = Field(default="", alias="@odata.id")
    id: str = Field(alias="Id")
    ports: Link | None = Field(default=None, alias="Ports")
    cxl: SwitchCxl | None = Field(default=None, alias="CXL")


class VcsLinks(_Wire):
    endpoints: Links = Field(default_factory=list, alias="Endpoints")
    port: Link | None = Field(default=None, alias="Port")

    listed = field_validator("endpoints", mode="before")(_links)


class VirtualCxlSwitch(_Wire):
    """A host port's virtual switch: its vPPBs are how many devices the host can take."""

    odata_id: str = Field(alias="@odata.id")
    vppbs: Link | None = Field(default=None, alias="VPPBs")
    links: VcsLinks = Field(default_factory=VcsLinks, alias="Links")


class PortLinks(_Wire):
    associated_endpoints: Links = Field(default_factory=list, alias="AssociatedEndpoints")
    connected_ports: Links = Field(default_factory=list, alias="ConnectedPorts")
    connected_switch_ports: Links = Field(default_factory=list, alias="ConnectedSwitchPorts")
    connected_switches: Links = Field(default_factory=list, alias="ConnectedSwitches")

    listed = field_validator(
        "associated_endpoints", "connected_ports", "connected_switch_ports",
        "connected_switches", mode="before",
    )(_links)  # fmt: skip


class Port(_Wire):
    odata_id: str = Field(alias="@odata.id")
    links: PortLinks = Field(default_factory=PortLinks, alias="Links")


class System(_Wire):
    id: str = Field(default="", alias="Id")
    uuid: str | None = Field(default=None, alias="UUID")
    host_name: str | None = Field(default=None, alias="HostName")


class DeviceLinks(_Wire):
    """The ``Links`` of a Processor, Drive, CXLLogicalDevice or PCIeFunction."""

    pcie_device: Link | None = Field(default=None, alias="PCIeDevice")
    pcie_function: Link | None = Field(default=None, alias="PCIeFunction")  # of a NIC function
    pcie_functions: Links = Field(default_factory=list, alias="PCIeFunctions")
    memory_chunks: Links = Field(default_factory=list, alias="MemoryChunks")

    listed = field_validator("pcie_functions", "memory_chunks", mode="before")(_links)


class Ethernet(_Wire):
    permanent_mac: str | None = Field(default=None, alias="PermanentMACAddress")
    mac: str | None = Field(default=None, alias="MACAddress")
    associated_macs: list[str] = Field(default_factory=list, alias="AssociatedMACAddresses")


class Device(_Wire):
    """What a Processor, Drive, NetworkAdapter, CXLLogicalDevice, PCIeDevice or
    PCIeFunction may carry of a device's identity (each has some of these)."""

    model: str | None = Field(default=None, alias="Model")
    serial: str | None = Field(default=None, alias="SerialNumber")
    processor_type: str | None = Field(default=None, alias="ProcessorType")
    uuid: str | None = Field(default=None, alias="UUID")
    protocol: str | None = Field(default=None, alias="Protocol")
    capacity_bytes: int | None = Field(default=None, alias="CapacityBytes", ge=0)
    memory_size_mib: int | None = Field(default=None, alias="MemorySizeMiB", ge=0)
    semantics: list[str] = Field(default_factory=list, alias="SemanticsSupported")
    identifiers: list[Identifier] = Field(default_factory=list, alias="Identifiers")
    vendor_id: str | None = Field(default=None, alias="VendorId", pattern=HEX_ID)
    device_id: str | None = Field(default=None, alias="DeviceId", pattern=HEX_ID)
    class_code: str | None = Field(default=None, alias="ClassCode")
    device_class: str | None = Field(default=None, alias="DeviceClass")
    functions: Link | None = Field(default=None, alias="PCIeFunctions")  # of a PCIeDevice
    device_functions: Link | None = Field(default=None, alias="NetworkDeviceFunctions")
    ports: Link | None = Field(default=None, alias="Ports")
    ethernet: Ethernet | None = Field(default=None, alias="Ethernet")  # a NIC function
    links: DeviceLinks = Field(default_factory=DeviceLinks, alias="Links")


class Volume(_Wire):
    odata_id: str = Field(alias="@odata.id")
    capacity_bytes: int = Field(default=0, alias="CapacityBytes", ge=0)
    identifiers: list[Identifier] = Field(default_factory=list, alias="Identifiers")


def last_segment(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def segment_after(uri: str, name: str) -> str:
    """The path segment after ``name`` (``.../FabricAdapters/<this>/...``), or ""."""
    parts = uri.rstrip("/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == name:
            return parts[i + 1]
    return ""
