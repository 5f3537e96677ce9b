"""The plugin's checkpoint as a restarted plugin reads it, for tests that look
at a running plugin's files: the file (format 1), then its journal's entries
replayed (driver/journal.py). The file alone lags the journal until the
plugin compacts it, so a test that read only the file would race the
compaction at rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from driver.journal import journal_path


def recorded(path: Path) -> dict[str, Any]:
    """The checkpoint document at ``path`` with its journal replayed
    (``{}`` claims when neither exists)."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"claims": {}}
    claims: dict[str, Any] = doc.setdefault("claims", {})
    journal = journal_path(path)
    raw = journal.read_bytes() if journal.exists() else b""
    for line in raw.split(b"\n"):
        try:
            entry = json.loads(line) if line.strip() else None
        except ValueError:
            continue  # a torn last entry
        if not isinstance(entry, dict):
            continue
        if "boot_id" in doc and entry.get("boot") != doc["boot_id"]:
            continue  # written before a reboot
        if entry.get("record") is None:
            claims.pop(entry["uid"], None)
        else:
            claims[entry["uid"]] = entry["record"]
    return doc
