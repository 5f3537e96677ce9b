"""A process's exit code says which of our errors ended it, also from a task group.

The plugin and the controller run their vital tasks in one supervising
``asyncio.TaskGroup``; when one fails the group raises an
``ExceptionGroup``. ``driver.process.run_process`` must turn that into the
exit code of the error inside it (``driver.errors``: 2 configuration, 3
discovery and hot-plug, 4 Kubernetes API, 5 leader lease lost, 1 any other)
and one log line, not an uncaught group traceback with exit status 1. A bug
(an exception that is not ours) keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator

import pytest

from driver import errors
from driver.process import ProcessSettings, exit_status, run_process


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def in_task_group(*failures: BaseException) -> Callable[[ProcessSettings], Awaitable[None]]:
    """A run coroutine whose task group has a task that never ends and failing ones."""

    async def fail(exc: BaseException) -> None:
        await asyncio.sleep(0)
        raise exc

    async def run(_: ProcessSettings) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.Event().wait(), name="serving")
            for exc in failures:
                group.create_task(fail(exc))

    return run


def test_a_hotplug_error_in_the_task_group_exits_3_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = in_task_group(errors.HotplugError("hot-plug event source ended"))
    assert run_process(ProcessSettings, run, "patchbay-test", []) == 3
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "ERROR" in lines[0]
    assert "exiting with status 3: HotplugError: hot-plug event source ended" in lines[0]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.ConfigError("bad adapters file"), 2),
        (errors.SocketPathError("path too long"), 2),
        (errors.HotplugError("ended"), 3),
        (errors.NvmlError(999, "UNKNOWN", "init failed"), 3),
        (errors.ApiError("apiserver gone"), 4),
        (errors.ApiStatusError("GET", "/api/v1/nodes/n", 403, "{}"), 4),
        (errors.LeaseLost("leader lease lost"), 5),
        (errors.ClaimError("refused"), 1),
        (errors.FabricUnavailable("no fabric"), 1),
        (errors.Stopped(), 0),
    ],
)
def test_each_error_type_has_its_exit_code(error: errors.PatchbayError, code: int) -> None:
    assert exit_status(error) == (code, f"{type(error).__name__}: {error}")
    assert exit_status(ExceptionGroup("tasks", [error])) == (
        code,
        f"{type(error).__name__}: {error}",
    )
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [error])])
    assert exit_status(nested) == (code, f"{type(error).__name__}: {error}")


def test_the_first_failure_decides_and_every_error_is_named() -> None:
    group = ExceptionGroup(
        "tasks", [errors.Stopped("SIGTERM"), errors.ApiError("gone"), errors.HotplugError("x")]
    )
    assert exit_status(group) == (4, "Stopped: SIGTERM; ApiError: gone; HotplugError: x")


def test_two_errors_failing_together_exit_with_the_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = in_task_group(errors.LeaseLost("lease lost"), errors.ApiError("gone"))
    assert run_process(ProcessSettings, run, "patchbay-test", []) == 5
    (line,) = capsys.readouterr().err.splitlines()
    assert "LeaseLost: lease lost; ApiError: gone" in line


def test_a_stopped_task_group_exits_0() -> None:
    run = in_task_group(errors.Stopped("SIGTERM"))
    assert run_process(ProcessSettings, run, "patchbay-test", []) == 0


def test_a_bug_in_the_task_group_keeps_its_traceback() -> None:
    run = in_task_group(KeyError("bug"), errors.HotplugError("ended"))
    with pytest.raises(ExceptionGroup) as info:
        run_process(ProcessSettings, run, "patchbay-test", [])
    assert {type(e) for e in info.value.exceptions} == {KeyError, errors.HotplugError}
    assert exit_status(info.value) is None


def test_bad_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    run = in_task_group()
    code = run_process(ProcessSettings, run, "patchbay-test", ["--log-level", "loud"])
    assert code == 2
    assert "patchbay-test:" in capsys.readouterr().err
