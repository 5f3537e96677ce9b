"""The sleep lint (hack/sleep_lint.py): every ``sleep(`` call in tests/ is on
the allowlist with a reason, or ``make lint`` fails naming file:line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

LINT = Path(__file__).resolve().parents[2] / "hack" / "sleep_lint.py"


def lint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sleep_lint", LINT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tree(tmp_path: Path, allowlist: str) -> Path:
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_x.py").write_text(
        "import asyncio, time\n"
        "async def f() -> None:\n"
        "    await asyncio.sleep(0)\n"
        "    time.sleep(0.5)  # poll\n"
        "    x = 'time.sleep(9)'  # a string, not a call\n"
        "    await asyncio.sleep(3)\n"
    )
    path = tmp_path / "allow.toml"
    path.write_text(allowlist)
    return path


YIELD = '[[anywhere]]\nmatch = "asyncio.sleep(0)"\nreason = "yield"\n'
POLL = '[[allow]]\nfile = "tests/unit/test_x.py"\nmatch = "# poll"\nreason = "a poll"\n'


def test_an_unlisted_sleep_fails_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allowlist = tree(tmp_path, YIELD + POLL)
    assert lint().main(tmp_path, allowlist) == 1
    err = capsys.readouterr().err
    assert "tests/unit/test_x.py:6: sleep not in allow.toml: await asyncio.sleep(3)" in err
    assert ":3:" not in err and ":4:" not in err and ":5:" not in err


def test_listed_sleeps_pass_and_a_stale_entry_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    more = '[[allow]]\nfile = "tests/unit/test_x.py"\nmatch = "sleep(3)"\nreason = "r"\n'
    assert lint().main(tmp_path, tree(tmp_path, YIELD + POLL + more)) == 0
    gone = '[[allow]]\nfile = "tests/unit/test_y.py"\nmatch = "sleep(1)"\nreason = "r"\n'
    (tmp_path / "allow.toml").write_text(YIELD + POLL + more + gone)
    assert lint().main(tmp_path, tmp_path / "allow.toml") == 1
    assert (
        "entry matches no sleep call: tests/unit/test_y.py: 'sleep(1)'" in capsys.readouterr().err
    )


def test_an_entry_without_a_reason_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allowlist = tree(tmp_path, '[[allow]]\nfile = "tests/unit/test_x.py"\nmatch = "sleep"\n')
    assert lint().main(tmp_path, allowlist) == 1
    assert "[[allow]] #1 needs a non-empty reason" in capsys.readouterr().err


def test_the_repository_passes() -> None:
    assert lint().main() == 0


def test_a_folder_entry_covers_the_files_under_it(tmp_path: Path) -> None:
    folder = '[[allow]]\nfile = "tests/unit/"\nmatch = "sleep("\nreason = "r"\n'
    assert lint().main(tmp_path, tree(tmp_path, folder)) == 0
    (tmp_path / "allow.toml").write_text(folder.replace("tests/unit/", "tests/e2e/"))
    assert lint().main(tmp_path, tmp_path / "allow.toml") == 1
