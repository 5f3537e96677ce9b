"""Request bodies at the trust boundary: parsing and 400s that name the field.

``POST .../Connections`` names exactly one initiator and one target endpoint
by ``@odata.id``; ``PATCH .../Zones/<zone>`` names the zone's endpoints;
``POST .../SessionService/Sessions`` logs in; ``POST /patchbay/v1/faults``
sets fault-injection knobs. All are pydantic models with unknown fields
refused (or ignored where clients echo them back); a validation failure
becomes a Redfish 400 whose message and ``RelatedProperties`` name the field
(``Links.TargetEndpoints[0].@odata.id``).
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fabric.service.errors import RedfishError, bad_property

M = TypeVar("M", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Ref(_Body):
    odata_id: str = Field(alias="@odata.id", min_length=1)


class ConnectionLinks(_Body):
    initiators: Annotated[list[Ref], Field(min_length=1, max_length=1)] = Field(
        alias="InitiatorEndpoints"
    )
    targets: Annotated[list[Ref], Field(min_length=1, max_length=1)] = Field(
        alias="TargetEndpoints"
    )


class ConnectionCreate(BaseModel):
    # Clients may send informational properties (Name, ConnectionType); ignore them.
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    links: ConnectionLinks = Field(alias="Links")


class ZoneLinks(_Body):
    endpoints: list[Ref] = Field(alias="Endpoints")


class ZonePatch(BaseModel):
    # Read-only properties a client echoes back (Id, @odata.etag, ...) are ignored.
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    links: ZoneLinks = Field(alias="Links")


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    user: str = Field(alias="UserName", min_length=1)
    password: str = Field(alias="Password")


class DeviceFaults(_Body):
    health: Literal["OK", "Warning", "Critical"] | None = None
    in_use: bool | None = Field(default=None, alias="inUse")
    foreign_owner: str | None = Field(default=None, alias="foreignOwner")
    # CXL memory the host cannot offline (pages pinned): its detach is refused by
    # the host, the device stays attached (needs the device attached).
    memory_in_use: bool | None = Field(default=None, alias="memoryInUse")
    # Its Endpoint answers 500 (a manager with one broken resource); an attach
    # of it is refused with 400 (a manager that will not attach it).
    broken_endpoint: bool | None = Field(default=None, alias="brokenEndpoint")
    refuse_attach: bool | None = Field(default=None, alias="refuseAttach")


class FaultsUpdate(_Body):
    fail_next_attaches: int | None = Field(default=None, ge=0, alias="failNextAttaches")
    fail_next_detaches: int | None = Field(default=None, ge=0, alias="failNextDetaches")
    attach_latency: float | None = Field(default=None, ge=0, alias="attachLatencySeconds")
    detach_latency: float | None = Field(default=None, ge=0, alias="detachLatencySeconds")
    devices: dict[str, DeviceFaults] = Field(default_factory=dict)


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def parse(model: type[M], raw: bytes) -> M:
    """``raw`` as ``model``, or a RedfishError 400 naming the first bad field."""
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise RedfishError(400, "MalformedJSON", f"request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RedfishError(400, "MalformedJSON", "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = _field(tuple(err["loc"]))
        kind = err["type"]
        if kind == "missing":
            raise bad_property(field, "required property missing", "PropertyMissing") from exc
        if kind == "extra_forbidden":
            raise bad_property(field, "unknown property", "PropertyUnknown") from exc
        raise bad_property(field, err["msg"], "PropertyValueTypeError") from exc
