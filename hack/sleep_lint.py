"""Fail on any ``sleep(`` call in ``tests/`` that the allowlist does not name.

Why: a test that sleeps a fixed time and then asserts that nothing happened
passes on a slow machine for the wrong reason and fails on a loaded one; a
test that counts what happened in so many seconds asserts the machine's
speed. Such a check waits on the signal that would show the thing happening
(a watch, a log line, a metric, a counter) or runs on an injected clock. A
sleep stays only where it is harmless, and then it is written down with its
reason in ``hack/sleep_allowlist.toml``:

- ``[[allow]]``: ``file`` (relative to the repository; ending in ``/``: every
  file under that folder), ``match`` (a piece of the call's source line, not
  a line number, so edits above it do not break the entry) and ``reason``;
  every ``sleep(`` call in that file whose line holds ``match`` is allowed.
- ``[[anywhere]]``: ``match`` and ``reason`` for a pattern allowed in every
  file (``asyncio.sleep(0)``: one turn of the event loop, no time passes).

Every call is found by the parser (``time.sleep(...)``, ``asyncio.sleep(...)``,
``sleep(...)`` and any other ``<x>.sleep(...)``), so a word in a string or a
comment is not one. An entry that matches no call fails too: the list says
what is there, not what once was. Run: ``python hack/sleep_lint.py``.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
ROOT = "tests"
ALLOWLIST = Path(__file__).resolve().parent / "sleep_allowlist.toml"


@dataclass(frozen=True)
class Entry:
    file: str | None  # None: any file ([[anywhere]])
    match: str
    reason: str


@dataclass(frozen=True)
class Call:
    file: str
    line: int
    source: str  # the call's first source line, stripped


def load(path: Path) -> list[Entry]:
    """The allowlist's entries; a missing or empty field is an error naming it."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    unknown = set(data) - {"allow", "anywhere"}
    if unknown:
        raise ValueError(f"{path.name}: unknown table(s) {sorted(unknown)}")
    entries = []
    for table, fields in (
        ("allow", ("file", "match", "reason")),
        ("anywhere", ("match", "reason")),
    ):
        for i, raw in enumerate(data.get(table, ())):
            for field in fields:
                if not isinstance(raw.get(field), str) or not raw[field].strip():
                    raise ValueError(f"{path.name}: [[{table}]] #{i + 1} needs a non-empty {field}")
            entries.append(Entry(raw.get("file"), raw["match"], raw["reason"]))
    return entries


def sleep_calls(path: Path, rel: str) -> list[Call]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text, filename=rel)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "sleep":
            out.append(Call(rel, node.lineno, lines[node.lineno - 1].strip()))
    return sorted(out, key=lambda c: c.line)


def covers(entry: Entry, rel: str) -> bool:
    """The entry is about this file: any file, the file itself, or a folder
    (``file`` ending in ``/``) that holds it."""
    if entry.file is None or entry.file == rel:
        return True
    return entry.file.endswith("/") and rel.startswith(entry.file)


def check(top: Path, entries: list[Entry]) -> tuple[list[Call], list[Entry]]:
    """Calls no entry allows, and entries that allow no call."""
    used: set[Entry] = set()
    bad = []
    for path in sorted((top / ROOT).rglob("*.py")):
        rel = path.relative_to(top).as_posix()
        for call in sleep_calls(path, rel):
            hits = [e for e in entries if covers(e, rel) and e.match in call.source]
            used.update(hits)
            if not hits:
                bad.append(call)
    return bad, [e for e in entries if e not in used]


def main(top: Path = TOP, allowlist: Path = ALLOWLIST) -> int:
    try:
        entries = load(allowlist)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"sleep lint: {exc}", file=sys.stderr)
        return 1
    bad, stale = check(top, entries)
    for call in bad:
        print(f"{call.file}:{call.line}: sleep not in {allowlist.name}: {call.source}",
              file=sys.stderr)  # fmt: skip
    for entry in stale:
        where = entry.file or "any file"
        print(f"{allowlist.name}: entry matches no sleep call: {where}: {entry.match!r}",
              file=sys.stderr)  # fmt: skip
    if bad:
        print("a test waits on a signal (a watch, a log line, a metric) for a bounded time, "
              "or on an injected clock; a harmless sleep goes on the list with its reason",
              file=sys.stderr)  # fmt: skip
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
