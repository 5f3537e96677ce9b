"""The test-import lint (hack/test_imports_lint.py): no module under tests/ or
hack/ imports a test module, however the import is written, or ``make lint``
fails naming file:line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LINT = Path(__file__).resolve().parents[2] / "hack" / "test_imports_lint.py"


def lint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_imports_lint", LINT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def tree(tmp_path: Path, source: str) -> Path:
    (tmp_path / "hack").mkdir()
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    (unit / "test_a.py").write_text("X = 1\n")
    (unit / "world.py").write_text(source)
    return tmp_path


def test_every_way_of_importing_a_test_module_is_named(tmp_path: Path) -> None:
    top = tree(
        tmp_path,
        "from tests.unit.test_a import X\n"
        "import tests.unit.test_a\n"
        "from tests.unit import test_a as a\n"
        "from .test_a import X as Y\n"
        "def f() -> None:\n"
        "    from tests.e2e.test_b import fixture  # inside a function too\n",
    )
    assert lint().problems(top) == [
        "tests/unit/world.py:1: imports tests.unit.test_a",
        "tests/unit/world.py:2: imports tests.unit.test_a",
        "tests/unit/world.py:3: imports tests.unit.test_a",
        "tests/unit/world.py:4: imports tests.unit.test_a",
        "tests/unit/world.py:6: imports tests.e2e.test_b",
    ]


def test_helper_modules_and_a_name_starting_test_inside_one_pass(tmp_path: Path) -> None:
    top = tree(
        tmp_path,
        "from tests.unit.world_helpers import test_value\n"
        "from tests.signals import Signal\n"
        "import pytest\n",
    )
    assert lint().problems(top) == []


def test_the_repository_has_none() -> None:
    assert lint().problems() == []
