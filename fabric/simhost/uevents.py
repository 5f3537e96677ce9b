"""Emitting kernel-shaped PCI uevents onto a simulated host's feed.

Events are appended, one JSON object per line, to ``<host dir>/uevents.jsonl``
in a single ``write`` under an exclusive ``flock``, with a sequence number
like the kernel's ``SEQNUM``; ``driver.pci.uevents.UeventFeed`` reads them.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from driver.pci.uevents import encode


class UeventEmitter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.touch()

    def _next_seq(self) -> int:
        with open(self.path, "rb") as f:
            return sum(1 for _ in f) + 1

    def emit(self, action: str, devpath: str, bdf: str, pci_id: str, pci_class: str) -> int:
        """Append one event; returns its sequence number."""
        with open(self.path, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                seq = self._next_seq()
                line = encode(
                    {
                        "ACTION": action,
                        "SUBSYSTEM": "pci",
                        "DEVPATH": devpath,
                        "PCI_SLOT_NAME": bdf,
                        "PCI_ID": pci_id,
                        "PCI_CLASS": pci_class,
                        "SEQNUM": str(seq),
                    }
                )
                f.write(line.encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return seq
