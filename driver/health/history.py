"""The Node's ``patchbay.dev/health`` annotation: each GPU's health and recent steps.

Why: the steps of a GPU's recovery are Events on the Node, and Events
expire (an hour by default); the health file that keeps them
(:mod:`driver.health.records`) is on the node, where an operator does not
look. So the plugin copies, per GPU that failed at least once, its state,
class, XID, reason, its resets and its last steps into an annotation of its
own Node, which ``kubectl patchbay nodes`` reads (:mod:`driver.inspect.nodes`).
Why an annotation of its own and not a section of ``patchbay.dev/fabric``:
docs/health.md, "Where the history lives".

The annotation follows the file: it is rebuilt after every save of the
file (a step, a record gone) and written only when its text changed, so a
node at rest writes nothing and a restarted plugin writes nothing unless
the file says something the Node does not. Bounded: at most
:data:`~driver.health.records.HISTORY` steps per GPU and
:data:`~driver.health.records.PAST_GPUS` healthy GPUs (the file's bounds),
notes cut to :data:`NOTE_CHARS`, and the whole text at most
:data:`CAP_BYTES` (the oldest steps go first), far below the 256 KiB the
apiserver allows all of an object's annotations together.

The format (compact JSON; times RFC 3339 in UTC, to the second)::

    {"v": 1, "resetLimit": 3, "resetWindow": 86400,
     "gpus": {"GPU-<uuid>": {"state": "checking", "class": "reset", "xid": 48,
                             "reason": "", "since": "...", "resets": ["..."],
                             "steps": [["<time>", "<state after>", "<step>", "<note>"]]}}}

A GPU without a record reads ``"state": "healthy"`` (``"detached"``: a
fabric GPU whose detach ended its record) with its resets and past steps
only. Pure functions, no I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.health.records import DETACHED, ENDED, HEALTHY, HealthRecords

HEALTH_ANNOTATION = "patchbay.dev/health"
VERSION = 1
NOTE_CHARS = 80
CAP_BYTES = 16 * 1024

# One step as the annotation carries it: (time, state after it, step, note).
StepRow = tuple[str, str, str, str]


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class GpuHistory:
    """One GPU's health as the annotation says it."""

    state: str
    failure_class: str = ""
    xid: int | None = None
    reason: str = ""
    since: str = ""
    resets: tuple[str, ...] = ()  # when it was reset (the limit's window counts them)
    steps: tuple[StepRow, ...] = ()

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        if self.state not in ENDED:
            out |= {"class": self.failure_class, "xid": self.xid, "reason": self.reason}
            out["since"] = self.since
        return out | {"resets": list(self.resets), "steps": [list(s) for s in self.steps]}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GpuHistory:
        xid = raw.get("xid")
        return cls(
            str(raw.get("state") or ""),
            str(raw.get("class") or ""),
            int(xid) if xid is not None else None,
            str(raw.get("reason") or ""),
            str(raw.get("since") or ""),
            tuple(str(t) for t in raw.get("resets") or ()),
            tuple(_row(s) for s in raw.get("steps") or ()),
        )


def _row(raw: Any) -> StepRow:
    cells = [str(c) for c in raw][:4]
    cells += [""] * (4 - len(cells))
    return cells[0], cells[1], cells[2], cells[3]


@dataclass(frozen=True)
class NodeHealth:
    """Every GPU of the node that has a health story, by UUID."""

    reset_limit: int
    reset_window: float
    gpus: Mapping[str, GpuHistory] = field(default_factory=dict)

    def to_annotation(self) -> str | None:
        """The annotation's text, within :data:`CAP_BYTES`; None when no GPU
        has a story (the annotation is then removed, or never written)."""
        gpus = {u: g.as_json() for u, g in sorted(self.gpus.items())}
        doc = {"v": VERSION, "resetLimit": self.reset_limit,
               "resetWindow": int(self.reset_window), "gpus": gpus}  # fmt: skip
        text = _dumps(doc)
        while len(text.encode()) > CAP_BYTES and _drop_oldest(gpus):
            text = _dumps(doc)
        return text if gpus else None

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeHealth | None:
        """The Node's annotation, or None without it (or malformed)."""
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(HEALTH_ANNOTATION)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            gpus = {str(u): GpuHistory.from_json(g) for u, g in (data.get("gpus") or {}).items()}
            return cls(int(data.get("resetLimit", 0)), float(data.get("resetWindow", 0)), gpus)
        except (ValueError, AttributeError, TypeError):
            return None


def _dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _drop_oldest(gpus: dict[str, dict[str, Any]]) -> bool:
    """Drop the oldest step of all (and a healthy GPU left with nothing to
    tell); False when nothing is left to drop."""
    stepped = [u for u, g in gpus.items() if g["steps"]]
    if not stepped:
        return False
    oldest = min(stepped, key=lambda u: (gpus[u]["steps"][0][0], u))
    gpu = gpus[oldest]
    gpu["steps"] = gpu["steps"][1:]
    if gpu["state"] in ENDED and not gpu["steps"] and not gpu["resets"]:
        del gpus[oldest]
    return True


def node_health(records: HealthRecords, reset_limit: int, reset_window: float) -> NodeHealth:
    """What the health file says of every GPU that failed (the annotation's content)."""
    data = records.data
    out: dict[str, GpuHistory] = {}
    for uuid in sorted({*data.gpus, *data.past, *data.resets}):
        resets = tuple(stamp(t) for t in data.resets.get(uuid, []))
        steps = tuple(
            (stamp(s.at), s.phase, s.step, s.note[:NOTE_CHARS]) for s in records.history(uuid)
        )
        record = data.gpus.get(uuid)
        if record is None:
            if steps or resets:  # a fabric GPU whose detach ended it reads "detached"
                state = DETACHED if steps and steps[-1][1] == DETACHED else HEALTHY
                out[uuid] = GpuHistory(state, resets=resets, steps=steps)
            continue
        out[uuid] = GpuHistory(
            record.phase, record.failure_class, record.xid, record.reason,
            stamp(record.since), resets, steps,
        )  # fmt: skip
    return NodeHealth(reset_limit, reset_window, out)
