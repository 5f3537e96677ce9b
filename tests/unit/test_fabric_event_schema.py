"""The fabric's SSE events against DMTF's ``Event`` schema (issue 22).

DMTF's service validator does only GETs, so it never sees an event. Here
every record the fabric's :class:`EventBus` publishes, for each message it
uses, is checked against the CSDL in ``../shared/redfish/csdl``
(Event_v1.xml, Resource_v1.xml): the properties the declared ``Event``
version requires (walking the type's ``BaseType`` chain: ``MemberId`` from
``Resource.v1_0_0.ReferenceableMember``, ``EventType`` and ``MessageId``
from ``Event.v1_0_0.EventRecord``), only properties the schema defines,
``EventType`` one of its enum members, ``MessageId`` matching its pattern,
plus what the wire contract asks of each record (``EventId``,
``OriginOfCondition``).
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fabric.service import events

CSDL = Path(__file__).resolve().parents[3] / "shared" / "redfish" / "csdl"
EDM = "{http://docs.oasis-open.org/odata/ns/edm}"
MESSAGES = (events.CREATED, events.REMOVED, events.CHANGED, events.TASK_DONE, events.TASK_FAILED)


def _version(namespace: str) -> tuple[int, ...]:
    part = namespace.split(".")[1] if "." in namespace else ""
    return tuple(int(n) for n in part[1:].split("_")) if part.startswith("v") else ()


@cache
def _schemas(family: str) -> list[ET.Element]:
    path = CSDL / f"{family}_v1.xml"
    assert path.exists(), f"the DSP8010 CSDL is missing: {path}"
    return list(ET.parse(path).getroot().iter(f"{EDM}Schema"))


def _find(qualified: str) -> ET.Element | None:
    """The EntityType ``Ns[.vX_Y_Z].Name``: in that schema, or the nearest lower version."""
    namespace, name = qualified.rsplit(".", 1)
    family, want = namespace.split(".")[0], _version(namespace)
    found: list[tuple[tuple[int, ...], ET.Element]] = []
    for schema in _schemas(family):
        ns = schema.get("Namespace", "")
        if ns.split(".")[0] != family or (_version(ns) > want if want else ns != namespace):
            continue
        for kind in ("EntityType", "ComplexType"):
            for el in schema.findall(f"{EDM}{kind}[@Name='{name}']"):
                found.append((_version(ns), el))
    return max(found, key=lambda f: f[0])[1] if found else None


def properties(qualified: str) -> dict[str, ET.Element]:
    """Every property of a type and its bases, by name."""
    out: dict[str, ET.Element] = {}
    el = _find(qualified)
    while el is not None:
        for kind in ("Property", "NavigationProperty"):
            for prop in el.findall(f"{EDM}{kind}"):
                out.setdefault(prop.get("Name", ""), prop)
        base = el.get("BaseType")
        el = _find(base) if base else None
    return out


def _required(props: dict[str, ET.Element]) -> set[str]:
    term = f"{EDM}Annotation[@Term='Redfish.Required']"
    return {name for name, prop in props.items() if prop.find(term) is not None}


def published() -> list[dict[str, Any]]:
    """The events an EventBus sends a subscriber for each message the fabric uses."""

    async def run() -> list[dict[str, Any]]:
        bus = events.EventBus()
        queue = bus.subscribe()
        for i, message_id in enumerate(MESSAGES):
            bus.publish(message_id, f"/redfish/v1/Fabrics/f/Connections/{i}", "/redfish/v1/x")
        return [e for _ in MESSAGES if (e := queue.get_nowait()) is not None]

    return asyncio.run(run())


@pytest.mark.parametrize("event", published(), ids=lambda e: e["Events"][0]["MessageId"])
def test_every_event_record_is_what_its_event_version_requires(event: dict[str, Any]) -> None:
    namespace = event["@odata.type"].lstrip("#").rsplit(".", 1)[0]  # Event.v1_7_0
    event_props = properties(f"{namespace}.Event")
    assert _required(event_props) <= set(event), sorted(_required(event_props) - set(event))
    record_props = properties(f"{namespace}.EventRecord")
    required = _required(record_props)
    assert {"MemberId", "EventType", "MessageId"} <= required  # the walk reached the bases
    event_types = {
        m.get("Name")
        for schema in _schemas("Event")
        for e in schema.findall(f"{EDM}EnumType[@Name='EventType']")
        for m in e.findall(f"{EDM}Member")
    }
    pattern = record_props["MessageId"].find(f"{EDM}Annotation[@Term='Validation.Pattern']")
    assert pattern is not None
    member_ids = set()
    for record in event["Events"]:
        assert required <= set(record), sorted(required - set(record))
        assert set(record) <= set(record_props), sorted(set(record) - set(record_props))
        assert {"EventId", "OriginOfCondition"} <= set(record)  # the wire contract's
        assert record["EventType"] in event_types
        assert re.match(pattern.get("String", ""), record["MessageId"])
        assert set(record["OriginOfCondition"]) == {"@odata.id"}
        member_ids.add(record["MemberId"])
    assert len(member_ids) == len(event["Events"])  # MemberId names each record
