"""The MPS hand-off between the plugin and the supervisor, as files and
processes: the simulated host's ``nvidia-cuda-mps-control`` stand-in, the
plugin's side (``MpsHandoff``) and the supervisor's passes
(``MpsSupervisor``) in a thread of this test.

A prepare waits for the supervisor's ready mark and fails naming the
supervisor when none comes; the supervisor's error reaches the prepare; a
claim directory nobody wants any more (an unprepare, or a want left behind
by a plugin that crashed) loses its daemon and directory; a daemon that died
is started again for the same want."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.errors import DeviceError
from driver.gpu.sharing.handoff import MpsHandoff
from driver.gpu.sharing.mps import MpsDaemons, start_time
from driver.gpu.sharing.supervisor import (
    NEW_CLAIM_GRACE_S,
    READY_FILE,
    WANT_FILE,
    MpsSupervisor,
    converge,
)
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.e2e.helpers import wait_for
from tests.sharing_claims import daemons_of

UUIDS = ["GPU-aaaa", "GPU-bbbb"]


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[MpsDaemons]:
    host = SimHost.build(TOPOLOGIES["2-gpus"](), tmp_path / "host")
    d = MpsDaemons(host.mps_control, host.mps_root)
    yield d
    for pid in daemons_of(host.mps_root):  # never leave one behind a failed test
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(host.mps_root, ignore_errors=True)


@contextlib.contextmanager
def running(daemons: MpsDaemons) -> Iterator[MpsSupervisor]:
    """The supervisor's passes in a thread (the process runs the same loop)."""
    sup = MpsSupervisor(daemons, poll=0.02)
    stop = threading.Event()
    thread = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield sup
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.fixture
def supervisor(daemons: MpsDaemons) -> Iterator[MpsSupervisor]:
    with running(daemons) as sup:
        yield sup


def test_prepare_waits_for_the_supervisor_and_unprepare_for_the_removal(
    daemons: MpsDaemons, supervisor: MpsSupervisor
) -> None:
    plugin = MpsHandoff(daemons, supervised=True)
    directory = plugin.directory("claim-1")
    pid = plugin.ensure(directory, UUIDS, 40, {UUIDS[0]: 2048})
    assert daemons.running(directory) == pid and daemons_of(daemons.root) == [pid]
    ready = json.loads((directory / READY_FILE).read_text())
    want = json.loads((directory / WANT_FILE).read_text())
    assert ready["request"] == want["request"] and ready["start_time"] == start_time(pid)
    told = json.loads((plugin.dirs(directory)[1] / "standin-state.json").read_text())
    assert told["visible_devices"] == ",".join(UUIDS)
    assert told["active_thread_percentage"] == 40
    assert told["pinned_mem_limits"] == {UUIDS[0]: "2048M"}
    # A second prepare (the plugin's start-up, another pod): the same daemon.
    assert plugin.ensure(directory, UUIDS, 40, {}) == pid
    plugin.stop(directory)
    assert not directory.exists() and daemons_of(daemons.root) == []


def test_without_a_supervisor_the_prepare_fails_naming_it(daemons: MpsDaemons) -> None:
    plugin = MpsHandoff(daemons, supervised=True, timeout=0.3)
    with pytest.raises(
        DeviceError, match=r"no ready mark from the MPS supervisor.*patchbay-mps-supervisor"
    ):
        plugin.ensure(plugin.directory("claim-1"), UUIDS, None, {})
    assert daemons_of(daemons.root) == []


def test_the_supervisors_error_reaches_the_prepare(daemons: MpsDaemons) -> None:
    broken = MpsDaemons(daemons.root / "no-such-tool", daemons.root)
    plugin = MpsHandoff(broken, supervised=True)
    with running(broken), pytest.raises(DeviceError) as err:
        plugin.ensure(plugin.directory("claim-1"), UUIDS, None, {})
    assert "MPS daemon of claim claim-1: cannot start the MPS control daemon" in str(err.value)
    assert "no-such-tool" in str(err.value)


def test_a_directory_nobody_wants_loses_its_daemon(
    daemons: MpsDaemons, supervisor: MpsSupervisor
) -> None:
    plugin = MpsHandoff(daemons, supervised=True)
    directory = plugin.directory("claim-1")
    pid = plugin.ensure(directory, UUIDS, None, {})
    (directory / WANT_FILE).unlink()  # the plugin crashed right after removing it
    wait_for("the directory removed", lambda: not directory.exists(), timeout=10)
    assert start_time(pid) is None and daemons_of(daemons.root) == []


def test_a_daemon_that_died_is_started_again_for_the_same_want(
    daemons: MpsDaemons, supervisor: MpsSupervisor
) -> None:
    plugin = MpsHandoff(daemons, supervised=True)
    directory = plugin.directory("claim-1")
    pid = plugin.ensure(directory, UUIDS, None, {})
    os.kill(pid, signal.SIGKILL)

    def restarted() -> int | None:  # the ready mark names the new daemon
        new = json.loads((directory / READY_FILE).read_text())["pid"]
        return int(new) if new != pid and daemons.running(directory) == new else None

    new = wait_for("a new daemon, ready", restarted, timeout=10)
    assert daemons_of(daemons.root) == [new]
    plugin.stop(directory)


def test_a_malformed_want_is_answered_with_an_error_not_a_crash(
    daemons: MpsDaemons, supervisor: MpsSupervisor
) -> None:
    directory = daemons.directory("claim-1")
    directory.mkdir(parents=True)
    (directory / WANT_FILE).write_text(json.dumps({"request": "r1", "threads": 40}))
    wait_for("an answer", lambda: (directory / READY_FILE).exists(), timeout=10)
    ready = json.loads((directory / READY_FILE).read_text())
    assert ready["request"] == "r1" and "malformed want.json" in ready["error"], ready
    # The supervisor goes on serving: another claim gets its daemon.
    plugin = MpsHandoff(daemons, supervised=True)
    other = plugin.directory("claim-2")
    assert daemons.running(other) is None
    assert plugin.ensure(other, UUIDS, None, {}) == daemons.running(other)
    plugin.stop(other)
    (directory / WANT_FILE).unlink()
    wait_for("the malformed claim's directory removed", lambda: not directory.exists(), 10)


def test_a_just_made_claim_directory_is_left_for_its_want(daemons: MpsDaemons) -> None:
    # The plugin makes the directory, then writes want.json into it: a pass
    # in between must not remove it (the want would be lost and prepare would
    # wait for an answer that never comes). What a plugin that died in
    # between left is removed once it is older than the grace.
    directory = daemons.directory("claim-new")
    directory.mkdir(parents=True)
    converge(daemons, directory)
    assert directory.exists(), "a just-made directory was taken for a claim that went"
    old = time.time() - NEW_CLAIM_GRACE_S - 1
    os.utime(directory, (old, old))
    converge(daemons, directory)
    assert not directory.exists(), "an empty leftover directory is removed after the grace"
