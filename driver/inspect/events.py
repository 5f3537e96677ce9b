"""The Warning Events ``claims`` and ``fabric`` read, newest first.

Why: a claim's troubles are recorded where kubectl users look for them, as
core/v1 Events, by components that do not share a status field: the
kubelet records ``FailedPrepareDynamicResources`` on the pod whose claims
it could not prepare (our node agent records the same one in the e2e
tier), the scheduler records ``FailedScheduling`` on the pod when a
binding failure condition cleared the allocation ("device binding failed:
..." with the condition's reason and message), and the controller records
its own Events on the claim. An Event's time is the newest of
``series.lastObservedTime``, ``lastTimestamp``, ``eventTime`` and
``firstTimestamp`` (old-style recorders fill the timestamps and a count,
new-style ones ``eventTime`` and a series; the API serves both as core/v1).
Pure functions on the Events' JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

PREPARE_FAILED = "FailedPrepareDynamicResources"
SCHEDULING_FAILED = "FailedScheduling"
BINDING_FAILED = "device binding failed"  # the scheduler's ErrDeviceBindingFailed


@dataclass(frozen=True)
class Reported:
    """One Warning Event as the views show it."""

    object: str  # "pod/<name>" or "resourceclaim/<name>"
    reason: str
    message: str
    time: str  # RFC 3339 as the API wrote it, "" when the Event has none
    count: int = 1

    def as_dict(self) -> dict[str, Any]:
        out = {"object": self.object, "reason": self.reason, "message": self.message}
        return out | {"time": self.time, "count": self.count}


def parse_time(text: str | None) -> datetime | None:
    """An API timestamp (``2026-12-01T11:32:07Z``, micro-time too) as an aware datetime."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def event_time(event: Mapping[str, Any]) -> str:
    """The newest time the Event carries (see the module docstring)."""
    series = event.get("series") or {}
    stamps = (
        series.get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    )
    dated = [(t, s) for s in stamps if s and (t := parse_time(s)) is not None]
    return max(dated)[1] if dated else ""


def _count(event: Mapping[str, Any]) -> int:
    series = event.get("series") or {}
    return int(series.get("count") or event.get("count") or 1)


def is_error(event: Mapping[str, Any]) -> bool:
    """A prepare failure, a binding failure, or any Warning on a claim."""
    reason, kind = event.get("reason"), (event.get("involvedObject") or {}).get("kind")
    if event.get("type") != "Warning":
        return False
    if kind == "Pod":
        return reason == PREPARE_FAILED or (
            reason == SCHEDULING_FAILED and BINDING_FAILED in str(event.get("message", ""))
        )
    return kind == "ResourceClaim"


def newest(events: Iterable[Mapping[str, Any]]) -> Reported | None:
    best: tuple[datetime, Reported] | None = None
    for e in events:
        obj = e.get("involvedObject") or {}
        when = event_time(e)
        message = str(e.get("message", ""))
        if e.get("reason") == SCHEDULING_FAILED and BINDING_FAILED in message:
            message = message[message.index(BINDING_FAILED) :]  # past the plugin's prefix
        r = Reported(
            f"{str(obj.get('kind', '')).lower()}/{obj.get('name', '')}",
            str(e.get("reason", "")),
            message,
            when,
            _count(e),
        )
        key = parse_time(when) or datetime.min.replace(tzinfo=UTC)
        if best is None or key >= best[0]:
            best = (key, r)
    return best[1] if best else None


class EventIndex:
    """Error Events by the object they are about: ``(kind, namespace, name)``."""

    def __init__(self, events: Iterable[Mapping[str, Any]]) -> None:
        self._by: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
        for e in events:
            if is_error(e):
                o = e.get("involvedObject") or {}
                key = (str(o.get("kind")), str(o.get("namespace", "")), str(o.get("name")))
                self._by.setdefault(key, []).append(e)

    def about(self, kind: str, namespace: str, names: Iterable[str]) -> list[Mapping[str, Any]]:
        return [e for n in names for e in self._by.get((kind, namespace, n), [])]

    def naming(self, word: str) -> list[Mapping[str, Any]]:
        """Error Events whose message names ``word`` (a fabric device id) as a whole word."""
        pattern = re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])")
        return [e for es in self._by.values() for e in es if pattern.search(str(e.get("message")))]
