"""Kernel-shaped PCI hot-plug events, and a reader for a simulated feed.

In production the plugin reads ``pci`` uevents through pyudev's monitor.
A simulated host writes the same events (``ACTION``, ``SUBSYSTEM``,
``DEVPATH``, ``PCI_SLOT_NAME``, ``PCI_ID``, ``PCI_CLASS``, plus ``SEQNUM``)
as JSON lines to a file; :class:`UeventFeed` reads them in order, woken
by inotify when the file changes (``driver.pci.filewatch``). A
:class:`Uevent` offers the pyudev ``Device`` attributes the plugin uses
(``action``, ``subsystem``, ``device_path``, ``sys_path``, ``get``), so one
handler serves both sources. This module is the format's single definition;
``fabric.simhost`` writes it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from driver.pci.filewatch import FileWatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Uevent:
    properties: Mapping[str, str]
    sysfs_root: str = "/sys"

    @property
    def action(self) -> str:
        return self.properties.get("ACTION", "")

    @property
    def subsystem(self) -> str:
        return self.properties.get("SUBSYSTEM", "")

    @property
    def device_path(self) -> str:
        return self.properties.get("DEVPATH", "")

    @property
    def sys_path(self) -> str:
        return self.sysfs_root.rstrip("/") + self.device_path

    @property
    def sequence_number(self) -> int:
        """``SEQNUM``; 0 when absent or not a number."""
        raw = self.properties.get("SEQNUM", "")
        return int(raw) if raw.isascii() and raw.isdigit() else 0

    @property
    def slot_name(self) -> str:
        return self.properties.get("PCI_SLOT_NAME", "")

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)


def encode(properties: Mapping[str, str]) -> str:
    """One feed line (no newline)."""
    return json.dumps(dict(properties), sort_keys=True)


class UeventFeed:
    """Follows a JSON-lines uevent file from its start (or ``offset``), in order."""

    def __init__(self, path: Path, sysfs_root: str = "/sys", offset: int = 0) -> None:
        self.path = path
        self.sysfs_root = sysfs_root
        self.offset = offset
        self._partial = b""
        self._watch: FileWatch | None = None

    def read_new(self) -> list[Uevent]:
        """Events appended since the last call (a torn last line waits for its end)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                props = json.loads(line)
            except ValueError:
                props = None
            if not isinstance(props, dict):  # a torn write, or not an event at all
                log.warning("skipping a malformed uevent line in %s: %r", self.path, line[:80])
                continue
            events.append(Uevent({str(k): str(v) for k, v in props.items()}, self.sysfs_root))
        return events

    def poll(self, timeout: float, interval: float = 0.02) -> list[Uevent]:
        """Wait up to ``timeout`` seconds for at least one event: woken by
        inotify when the file changes (every ``interval`` without it)."""
        if self._watch is None:  # before the first read: no write is missed
            self._watch = FileWatch(self.path, fallback_s=interval)
        deadline = time.monotonic() + timeout
        while True:
            events = self.read_new()
            remaining = deadline - time.monotonic()
            if events or remaining <= 0:
                return events
            self._watch.wait(remaining)

    def __iter__(self) -> Iterator[Uevent]:
        """Blocks forever, like iterating pyudev's monitor."""
        while True:
            yield from self.poll(3600.0)
