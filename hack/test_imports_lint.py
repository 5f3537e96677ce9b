"""Fail when any module imports a test module (``tests/**/test_*.py``).

Why: a test module is what pytest collects; when another module imports it,
its fixtures, tests and module-level setup come along (pytest may run them
twice, under two names), and a change to one test silently changes others.
What several tests share (a world, a fixture, a helper) lives in a helper
module named after its concept (``tests/unit/controller_world.py``), which
the tests import. import-linter cannot say "no module matching a name
pattern", so this script does, with the parser: every ``import`` and
``from ... import`` in ``tests/`` and ``hack/`` (at any depth in a module,
relative ones resolved) whose target is a test module fails, named with its
file and line. Run: ``python hack/test_imports_lint.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
ROOTS = ("tests", "hack")


def is_test_module(dotted: str) -> bool:
    """``tests.unit.test_x`` (or a module inside a ``test_*`` package)."""
    parts = dotted.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


def _is_module(top: Path, dotted: str) -> bool:
    path = top.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported(top: Path, path: Path, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module the file imports, with its line: ``import a.b``'s ``a.b``,
    ``from a import b``'s ``a``, and ``a.b`` too when ``b`` is a module file
    (``from tests.e2e import test_x``), not a name inside ``a``."""
    package = list(path.relative_to(top).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                if _is_module(top, f"{module}.{alias.name}"):
                    yield node.lineno, f"{module}.{alias.name}"


def problems(top: Path = TOP) -> list[str]:
    found = []
    for root in ROOTS:
        for path in sorted((top / root).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for line, name in imported(top, path, tree):
                if is_test_module(name):
                    found.append(f"{path.relative_to(top)}:{line}: imports {name}")
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(problem)
    if found:
        print(
            f"{len(found)} import(s) of test modules: move what they share to a helper "
            "module named after its concept and import that",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
