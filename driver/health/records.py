"""The health of the node's GPUs, kept across plugin restarts.

Why: a plugin that forgot a failed GPU on restart published it healthy
again, unchecked. Every unhealthy GPU has a record here: its failure class,
the XID, when, where its recovery stands (``phase``) and a short history of
steps; beside the records, each GPU's recent resets (the reset limit counts
them, so they outlive a record) and the steps of its past recoveries
(``past``: a GPU that was given back keeps its story). Events expire; this
is what the Node's ``patchbay.dev/health`` annotation
(:mod:`driver.health.history`) and so ``kubectl patchbay nodes`` show. A
GPU's record leaves the file only when a health check passed, or, for a
GPU a fabric adapter brought, when it was detached (the controller's pool
keeps its failure from then on: docs/health.md, "The fabric path").

The file is ``<plugin dir>/gpu-health.json``, written atomically
(``driver.atomicfile``) like the claim checkpoint (``driver.checkpoint``):
tiny, versioned, unknown fields kept so an older build that rewrites it
loses nothing a newer one wrote, and an unknown phase or class read as the
safe choice (stays tainted, never reset). A file that cannot be parsed is
moved aside and reported; its GPUs' health is then unknown, so the file's
absence is not taken for health: the monitor classes every GPU it cannot
vouch for by the next XID or check. The boot id is recorded: a reboot reset
every GPU, so a reset- or reboot-class GPU found after one goes straight to
the health check (still tainted until it passes).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from driver.atomicfile import write_atomic

log = logging.getLogger(__name__)

HEALTH_FILE = "gpu-health.json"
VERSION = 1
HISTORY = 12  # steps kept per GPU (its record's and its past ones together)
PAST_GPUS = 32  # GPUs whose past steps are kept (the most recently active ones)
HEALTHY = "healthy"  # the state after a passing check (a GPU without a record)
DETACHED = "detached"  # the state after a fabric GPU's detach ended its record
ENDED = (HEALTHY, DETACHED)  # the states of a GPU whose record went (its past steps stay)


class Phase:
    """Where a GPU's recovery stands (strings: a newer build may add some)."""

    TAINTED = "tainted"  # unhealthy, waiting (claims to end, policy, limit)
    RESETTING = "resetting"  # a reset was started (a crash here: reset again)
    CHECKING = "checking"  # reset done (or rebooted): the health check runs
    FAILED = "failed"  # a reset or check failed, or the limit was reached: stays


class Step(BaseModel):
    model_config = ConfigDict(extra="allow")

    at: float
    step: str
    note: str = ""
    phase: str = ""  # the phase the step left the GPU in ("healthy" once it passed)


class GpuRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    failure_class: str = Field(alias="class")
    xid: int
    since: float
    phase: str = Phase.TAINTED
    reason: str = ""
    boot: str = ""
    mig: bool | None = None  # MIG mode before a reset started, to restore after it
    # A GPU a fabric adapter brought: never reset here, its record ends with its
    # detach (seen at its PCI address, ``bus_id``); the fabric pool keeps the failure.
    fabric: bool = False
    bus_id: str = ""
    history: list[Step] = Field(default_factory=list)

    def add(self, step: str, note: str = "") -> None:
        """A step, after the phase it leaves the GPU in was set."""
        now = Step(at=time.time(), step=step, note=note, phase=self.phase)
        self.history = [*self.history, now][-HISTORY:]


class HealthFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: int = VERSION
    gpus: dict[str, GpuRecord] = Field(default_factory=dict)
    # When each GPU was reset (the reset limit counts them): outlives the records.
    resets: dict[str, list[float]] = Field(default_factory=dict)
    # The steps of each GPU's recoveries that ended healthy (its record went).
    past: dict[str, list[Step]] = Field(default_factory=dict)


class HealthRecords:
    """The file and its in-memory copy; every change is written at once."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data = HealthFile()
        # After every save (on the loop): the Node's health annotation follows.
        self.on_saved: Callable[[], None] | None = None

    @classmethod
    def in_dir(cls, directory: Path | None) -> HealthRecords:
        return cls(directory / HEALTH_FILE if directory is not None else None)

    def load(self) -> dict[str, GpuRecord]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            self.data = HealthFile.model_validate(json.loads(self.path.read_bytes()))
        except (ValueError, ValidationError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.replace(aside)
            log.error("GPU health file %s unreadable (moved to %s): %s", self.path, aside, exc)
            self.data = HealthFile()
        if self.data.version > VERSION:
            log.info("GPU health file version %d is newer than %d: reading what this build "
                     "knows, keeping the rest", self.data.version, VERSION)  # fmt: skip
        return dict(self.data.gpus)

    def get(self, uuid: str) -> GpuRecord | None:
        return self.data.gpus.get(uuid)

    def put(self, uuid: str, record: GpuRecord) -> None:
        self.data.gpus[uuid] = record
        self._save()

    def resets_within(self, uuid: str, window: float, now: float) -> int:
        return sum(1 for t in self.data.resets.get(uuid, []) if now - t < window)

    def note_reset(self, uuid: str, now: float, window: float) -> None:
        """A reset of ``uuid`` starts now (saved with the next put)."""
        kept = [t for t in self.data.resets.get(uuid, []) if now - t < window]
        self.data.resets[uuid] = [*kept, now]
        for other, times in list(self.data.resets.items()):  # forget old ones: stays tiny
            if not any(now - t < window for t in times):
                del self.data.resets[other]

    def unnote_reset(self, uuid: str) -> None:
        """The last reset did not happen (refused): it does not count."""
        times = self.data.resets.get(uuid, [])
        if times:
            self.data.resets[uuid] = times[:-1]

    def history(self, uuid: str) -> list[Step]:
        """The GPU's last steps: its past recoveries', then its record's."""
        record = self.data.gpus.get(uuid)
        return [*self.data.past.get(uuid, []), *(record.history if record else [])][-HISTORY:]

    def heal(self, uuid: str, note: str) -> None:
        """The health check passed: the record goes, its steps stay in ``past``."""
        self.end(uuid, HEALTHY, note)

    def end(self, uuid: str, state: str, note: str) -> None:
        """The record goes, ending in ``state`` (:data:`HEALTHY` after a passing
        check, :data:`DETACHED` for a fabric GPU that left); its steps stay in ``past``."""
        record = self.data.gpus.get(uuid)
        if record is None:
            return
        last = Step(at=time.time(), step=state, note=note, phase=state)
        steps = [*self.history(uuid), last][-HISTORY:]
        del self.data.gpus[uuid]
        self.data.past.pop(uuid, None)
        self.data.past[uuid] = steps
        while len(self.data.past) > PAST_GPUS:  # the one quiet longest goes
            del self.data.past[min(self.data.past, key=lambda u: self.data.past[u][-1].at)]
        self._save()

    def _save(self) -> None:
        if self.path is not None:
            doc: dict[str, Any] = self.data.model_dump(by_alias=True, mode="json")
            doc["version"] = max(self.data.version, VERSION)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        if self.on_saved is not None:
            self.on_saved()
