"""Pydantic models of the Redfish bodies we read: the client's trust boundary.

Only the properties the client uses are declared; everything else is
ignored, so a richer real fabric manager parses too. Parsing turns bodies
into the frozen values of ``model.py``. The ``Oem.Patchbay`` part of each
resource is typed too and validated with the rest of its body, so one
``model_validate`` checks everything the client will read (a malformed part
fails there, naming the resource, never later in a property).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

M = TypeVar("M", bound=BaseModel)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Link(_Wire):
    odata_id: str = Field(alias="@odata.id")


class EventRecord(_Wire):
    message_id: str = Field(default="", alias="MessageId")
    origin: Link | None = Field(default=None, alias="OriginOfCondition")


class Event(_Wire):
    """A Redfish ``Event`` from the EventService's SSE stream."""

    events: list[EventRecord] = Field(default_factory=list, alias="Events")


class Collection(_Wire):
    members: list[dict[str, Any]] = Field(alias="Members", default_factory=list)


class Status(_Wire):
    state: str = Field(default="Enabled", alias="State")
    health: Literal["OK", "Warning", "Critical"] = Field(default="OK", alias="Health")


HEX_ID = r"^(0[xX])?[0-9a-fA-F]{1,8}$"  # what the client reads as an int, base 16


class PciId(_Wire):
    vendor_id: str = Field(default="0x0", alias="VendorId", pattern=HEX_ID)
    device_id: str = Field(default="0x0", alias="DeviceId", pattern=HEX_ID)


class Entity(_Wire):
    entity_type: str = Field(default="", alias="EntityType")
    pci_id: PciId | None = Field(default=None, alias="EntityPciId")


class EndpointLinks(_Wire):
    ports: list[Link] = Field(default_factory=list, alias="ConnectedPorts")


class EndpointOem(_Wire):
    node: str = Field(default="", alias="Node")
    adapter: str = Field(default="", alias="Adapter")
    switch: str = Field(default="", alias="Switch")
    device_type: str = Field(default="", alias="DeviceType")
    model: str = Field(default="", alias="Model")
    serial: str = Field(default="", alias="SerialNumber")
    uuid: str = Field(default="", alias="UUID")
    mac: str = Field(default="", alias="MACAddress")
    in_use: bool = Field(default=False, alias="InUse")


class EndpointOemPart(_Wire):
    patchbay: EndpointOem = Field(default_factory=EndpointOem, alias="Patchbay")


class Endpoint(_Wire):
    odata_id: str = Field(alias="@odata.id")
    id: str = Field(alias="Id")
    role: Literal["Initiator", "Target", "Both"] = Field(alias="EntityRole")
    entities: list[Entity] = Field(default_factory=list, alias="ConnectedEntities")
    status: Status = Field(default_factory=Status, alias="Status")
    links: EndpointLinks = Field(default_factory=EndpointLinks, alias="Links")
    oem: EndpointOemPart = Field(default_factory=EndpointOemPart, alias="Oem")

    def patchbay(self) -> EndpointOem:
        return self.oem.patchbay

    def switch(self) -> str:
        """The switch, from the connected port's URI (``.../Switches/<sw>/Ports/<p>``)."""
        for port in self.links.ports:
            parts = port.odata_id.rstrip("/").split("/")
            if len(parts) >= 4 and parts[-4] == "Switches":
                return parts[-3]
        return self.patchbay().switch


class ConnectionLinks(_Wire):
    initiators: list[Link] = Field(alias="InitiatorEndpoints", min_length=1)
    targets: list[Link] = Field(alias="TargetEndpoints", min_length=1)


class ConnectionOem(_Wire):
    state: Literal["Attaching", "Attached", "Detaching"] = Field(alias="State")
    pci_bus_id: str = Field(default="", alias="PciBusId")
    task: Link | None = Field(default=None, alias="Task")


class ConnectionOemPart(_Wire):
    patchbay: ConnectionOem = Field(alias="Patchbay")


class Connection(_Wire):
    odata_id: str = Field(alias="@odata.id")
    id: str = Field(alias="Id")
    links: ConnectionLinks = Field(alias="Links")
    oem: ConnectionOemPart = Field(alias="Oem")  # its State is required

    def patchbay(self) -> ConnectionOem:
        return self.oem.patchbay


class Message(_Wire):
    message: str = Field(default="", alias="Message")


class TaskOem(_Wire):
    operation: str = Field(default="", alias="Operation")
    connection: Link | None = Field(default=None, alias="Connection")
    target: Link | None = Field(default=None, alias="Target")


class TaskOemPart(_Wire):
    patchbay: TaskOem = Field(default_factory=TaskOem, alias="Patchbay")


class Task(_Wire):
    odata_id: str = Field(alias="@odata.id")
    id: str = Field(alias="Id")
    state: Literal["New", "Running", "Completed", "Exception"] = Field(alias="TaskState")
    messages: list[Message] = Field(default_factory=list, alias="Messages")
    oem: TaskOemPart = Field(default_factory=TaskOemPart, alias="Oem")

    def patchbay(self) -> TaskOem:
        return self.oem.patchbay


class ErrorInfo(_Wire):
    code: str = "Base.GeneralError"
    message: str = ""


class ErrorBody(_Wire):
    error: ErrorInfo


def last_segment(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]
