"""docs/design.md lists the driver's import layers exactly as the
import-linter contract in pyproject.toml enforces them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_design_doc_lists_the_enforced_layers() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == "driver layers"
    ]
    doc = (REPO / "docs" / "design.md").read_text()
    listed = re.search(r"\"driver layers\".*?\n\n((?:    [^\n]+\n)+)", doc, re.S)
    assert listed, "docs/design.md has no layer list"
    assert [line.strip() for line in listed.group(1).splitlines()] == contract["layers"]
