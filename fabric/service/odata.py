"""The OData documents a Redfish service publishes: ``$metadata`` and the service document.

Why: DSP0266 requires both (``/redfish/v1/$metadata``: the CSDL schemas the
service's resources use; ``/redfish/v1/odata``: its top-level resources),
and the DMTF validators read them. The schemas are taken from the
``@odata.type`` of the bodies the service renders (:func:`types_in`), so
the document cannot drift from what is served.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from xml.sax.saxutils import quoteattr

from fabric.service import uris

SCHEMA_BASE = "http://redfish.dmtf.org/schemas/v1"
# Types the service names without rendering a resource of them (messages, records).
ALWAYS = ("#Message.v1_1_2.Message", "#Resource.v1_20_0.Resource")


def types_in(body: Any) -> set[str]:
    """Every ``@odata.type`` value in a JSON body, nested ones included."""
    found: set[str] = set()
    if isinstance(body, dict):
        for key, value in body.items():
            if key == "@odata.type" and isinstance(value, str):
                found.add(value)
            else:
                found |= types_in(value)
    elif isinstance(body, list):
        for value in body:
            found |= types_in(value)
    return found


def metadata(types: Iterable[str]) -> str:
    """The ``$metadata`` document naming the schema (and version) of each type."""
    namespaces: dict[str, set[str]] = {}
    for t in {*types, *ALWAYS}:
        parts = t.lstrip("#").split(".")
        versions = namespaces.setdefault(parts[0], set())
        if len(parts) == 3:
            versions.add(f"{parts[0]}.{parts[1]}")
    refs = []
    for name in sorted(namespaces):
        includes = "".join(
            f"<edmx:Include Namespace={quoteattr(n)}/>" for n in [name, *sorted(namespaces[name])]
        )
        uri = quoteattr(f"{SCHEMA_BASE}/{name}_v1.xml")
        refs.append(f"  <edmx:Reference Uri={uri}>{includes}</edmx:Reference>")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">\n'
        + "\n".join(refs)
        + "\n  <edmx:DataServices>\n"
        '    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">\n'
        '      <EntityContainer Name="Service" Extends="ServiceRoot.v1_20_0.ServiceContainer"/>\n'
        "    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n"
    )


def service_document(root: dict[str, Any]) -> dict[str, Any]:
    """``/redfish/v1/odata``: the service root and each resource it links at top level."""
    value = [{"name": "Service", "kind": "Singleton", "url": f"{uris.ROOT}/"}]
    for name, target in sorted(root.items()):
        if isinstance(target, dict) and "@odata.id" in target and name != "Links":
            value.append({"name": name, "kind": "Singleton", "url": target["@odata.id"]})
    return {"@odata.context": f"{uris.ROOT}/$metadata", "value": value}
