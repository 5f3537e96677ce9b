"""Text tables as kubectl prints them: upper-case headers, columns padded
to their widest cell, three spaces between columns, no trailing blanks.

Why a module: ``claims`` and ``fabric`` print tables with cells of any
width (claim names, error messages); one function keeps them alike.
"""

from __future__ import annotations

from collections.abc import Sequence

GAP = "   "


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``head`` and ``rows`` as aligned lines; the last column is not padded."""
    cells = [list(head), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = []
    for r in cells:
        padded = [c.ljust(w) for c, w in zip(r[:-1], widths[:-1], strict=True)] + [r[-1]]
        lines.append(GAP.join(padded).rstrip())
    return "\n".join(lines) + "\n"
