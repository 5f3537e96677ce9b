"""Redfish error bodies, and the exception that carries one to the HTTP layer.

Redfish answers a failed request with ``{"error": {"code", "message",
"@Message.ExtendedInfo": [...]}}``; ``code`` and each ``MessageId`` come from
the DMTF Base message registry. Domain code raises :class:`RedfishError` with
the HTTP status that fits; ``app.py`` renders it. Nothing here does I/O.
:class:`RedfishError` derives from the package's root error and is listed in
the tree of ``driver.errors``; it stays here, beside the registry it renders
with, because ``driver`` never imports the fabric service.
"""

from __future__ import annotations

from typing import Any

from driver.errors import FabricError

REGISTRY = "Base.1.18"

# MessageId suffix -> (severity, resolution)
_MESSAGES: dict[str, tuple[str, str]] = {
    "GeneralError": ("Critical", "See the message; retry later."),
    "MalformedJSON": ("Critical", "Send a valid JSON object."),
    "PropertyMissing": ("Warning", "Add the property to the request body."),
    "PropertyValueTypeError": ("Warning", "Correct the property's value."),
    "PropertyValueFormatError": ("Warning", "Correct the property's value."),
    "PropertyUnknown": ("Warning", "Remove the unknown property."),
    "ResourceMissingAtURI": ("Critical", "Name an existing resource."),
    "ResourceNotFound": ("Critical", "Name an existing resource."),
    "ResourceInUse": ("Warning", "Retry when the resource is released."),
    "ResourceInStandby": ("Critical", "Retry when the resource's operation ends."),
    "ResourceExhaustion": ("Critical", "Detach a device from the host first."),
    "ActionParameterValueConflict": ("Warning", "Name endpoints on one switch."),
    "NoValidSession": (
        "Critical",
        "Log in (POST /redfish/v1/SessionService/Sessions), or send HTTP Basic or a bearer token.",
    ),
    "InsufficientPrivilege": ("Critical", "Use valid credentials."),
    "OperationFailed": ("Critical", "Retry the operation."),
    "PreconditionFailed": ("Critical", "Read the resource again and retry with its ETag."),
    "PropertyValueNotInList": ("Warning", "Choose a value the resource allows."),
    "QueryNotSupported": ("Warning", "Leave the query parameter out."),
    "ActionNotSupported": ("Critical", "Do not ask this of the resource."),
    "InternalError": ("Critical", "Retry later; the service's log says what failed."),
}


def message(message_id: str, text: str, related: str | None = None) -> dict[str, Any]:
    """One ``Message`` object of the Base registry (``ExtendedInfo`` / task ``Messages``)."""
    severity, resolution = _MESSAGES.get(message_id, _MESSAGES["GeneralError"])
    out: dict[str, Any] = {
        "@odata.type": "#Message.v1_1_2.Message",
        "MessageId": f"{REGISTRY}.{message_id}",
        "Message": text,
        "MessageSeverity": severity,
        "Resolution": resolution,
    }
    if related is not None:
        out["RelatedProperties"] = [related]
    return out


class RedfishError(FabricError):
    """A request the service refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message_id: str, text: str, related: str | None = None):
        super().__init__(text)
        self.status = status
        self.message_id = message_id
        self.text = text
        self.related = related

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": f"{REGISTRY}.{self.message_id}",
                "message": self.text,
                "@Message.ExtendedInfo": [message(self.message_id, self.text, self.related)],
            }
        }


def not_found(uri: str) -> RedfishError:
    return RedfishError(404, "ResourceNotFound", f"no resource at {uri}")


def in_use(text: str) -> RedfishError:
    return RedfishError(409, "ResourceInUse", text)


def bad_property(
    field: str, text: str, message_id: str = "PropertyValueFormatError"
) -> RedfishError:
    return RedfishError(400, message_id, f"{field}: {text}", related=f"#/{field}")
