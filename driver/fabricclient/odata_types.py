"""The ``@odata.type`` of a body the client creates, at a version the service advertises.

Why a module: DSP0266 lets a service require ``@odata.type`` in a POSTed
body, and OFA Sunfish does (it answers a Connection without one with 400:
it routes a new resource by its type). The type names a schema version,
and a version the service does not implement may be refused too, so the
client takes the newest version the service itself shows: first the
``@odata.type`` of resources of that schema it already serves (the fabric's
Connections), else the schema namespaces its ``$metadata`` document
includes (``Connection.v1_4_0``), else ``v1_0_0`` (with a log line). What a
service shows is learnt once per client (:class:`~links.Capabilities`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from driver.errors import FabricApiError, FabricResourceBroken

if TYPE_CHECKING:  # auth uses this module too, and links sits above auth
    from driver.fabricclient.links import Links

log = logging.getLogger(__name__)
METADATA = "/redfish/v1/$metadata"
FALLBACK = "v1_0_0"


def _version(text: str, schema: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(rf"#?{re.escape(schema)}\.v(\d+)_(\d+)_(\d+)(\.{re.escape(schema)})?", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def in_metadata(schema: str, text: str) -> str:
    """The newest ``schema`` version a ``$metadata`` document includes, or ""."""
    return newest(schema, re.findall(rf'Namespace="({re.escape(schema)}\.v\d+_\d+_\d+)"', text))


def fallback(schema: str) -> str:
    return f"#{schema}.{FALLBACK}.{schema}"


def newest(schema: str, types: Iterable[str]) -> str:
    """``#<schema>.vX_Y_Z.<schema>`` of the newest version among ``types``, or ""."""
    found = [v for v in (_version(t, schema) for t in types) if v is not None]
    if not found:
        return ""
    major, minor, errata = max(found)
    return f"#{schema}.v{major}_{minor}_{errata}.{schema}"


async def odata_type(links: Links, schema: str, seen: Iterable[str] = ()) -> str:
    """The type to POST a ``schema`` resource with; ``seen``: the types of the ones
    the service serves now."""
    chosen = newest(schema, seen)
    if chosen:
        return chosen
    known = links.caps.types.get(schema)
    if known is not None:
        return known
    try:
        chosen = in_metadata(schema, await links.transport.get_text(METADATA))
    except (FabricApiError, FabricResourceBroken) as exc:
        log.info("fabric %s unreadable (%s): no schema versions from it", METADATA, exc)
    if not chosen:
        chosen = fallback(schema)
        log.info("fabric shows no %s version (no such resource, none in %s): using %s",
                 schema, METADATA, chosen)  # fmt: skip
    links.caps.types[schema] = chosen
    return chosen
