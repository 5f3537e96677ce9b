"""Socket path computation and the on-disk socket lifecycle, plus the
prepare lock (in-process and across processes)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.claims.lock import ClaimLock
from driver.errors import ConfigError, SocketPathError
from plugin.sockets import (
    MAX_SOCKET_PATH_BYTES,
    check_length,
    prepare_for_bind,
    remove_socket,
    socket_paths,
)
from tests.signals import waiting_in_flock

UID = "6b1e8f3c-2d4a-4f5e-9a7b-1c2d3e4f5a6b"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="pb-"))
    yield d
    for p in sorted(d.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    d.rmdir()


def test_default_paths() -> None:
    p = socket_paths()
    assert p.registration == Path("/var/lib/kubelet/plugins_registry/patchbay.dev-reg.sock")
    assert p.dra == Path("/var/lib/kubelet/plugins/patchbay.dev/dra.sock")
    assert p.lock_file == Path("/var/lib/kubelet/plugins/patchbay.dev/prepare.lock")


def test_rolling_update_paths_carry_pod_uid(tmp_path: Path) -> None:
    p = socket_paths(Path("/r"), Path("/p/patchbay.dev"), pod_uid=UID)
    assert p.registration == Path(f"/r/patchbay.dev-{UID}-reg.sock")
    assert p.dra == Path(f"/p/patchbay.dev/dra-{UID}.sock")
    assert p.plugin_dir == Path("/p/patchbay.dev")


def test_relative_dirs_become_absolute() -> None:
    p = socket_paths(Path("reg"), Path("plug"))
    assert p.dra.is_absolute() and p.registration.is_absolute()


@pytest.mark.parametrize("bad", ["../x", "a/b", "a b", ""])
def test_bad_pod_uid_refused(bad: str) -> None:
    if not bad:  # empty means "no rolling update", not an error
        assert socket_paths(pod_uid=bad).dra.name == "dra.sock"
        return
    with pytest.raises(ConfigError, match="pod UID"):
        socket_paths(pod_uid=bad)


def test_length_limit_is_107_bytes() -> None:
    ok = Path("/" + "a" * (MAX_SOCKET_PATH_BYTES - 1))
    check_length(ok)
    with pytest.raises(SocketPathError, match="108 bytes"):
        check_length(Path(str(ok) + "b"))
    with pytest.raises(SocketPathError):
        socket_paths(Path("/" + "r" * 100), Path("/p"))


def test_stale_socket_removed_before_bind(short_dir: Path) -> None:
    path = short_dir / "sub" / "dra.sock"
    prepare_for_bind(path)  # creates the directory, nothing to remove
    assert path.parent.is_dir()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    assert path.exists()
    prepare_for_bind(path)
    assert not path.exists()


def test_regular_file_in_place_of_socket_refused(short_dir: Path) -> None:
    path = short_dir / "dra.sock"
    path.write_text("not a socket")
    with pytest.raises(SocketPathError, match="not a socket"):
        prepare_for_bind(path)
    assert path.read_text() == "not a socket"
    remove_socket(path)  # never deletes what is not a socket
    assert path.exists()


def test_remove_socket(short_dir: Path) -> None:
    path = short_dir / "reg.sock"
    remove_socket(path)  # missing is fine
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    remove_socket(path)
    assert not path.exists()


async def test_claim_lock_serialises_in_process(short_dir: Path) -> None:
    lock = ClaimLock(short_dir / "prepare.lock")
    inside = 0
    peak = 0

    async def body() -> None:
        nonlocal inside, peak
        async with lock:
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(body() for _ in range(5)))
    assert peak == 1


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
"""


async def test_claim_lock_waits_for_other_process(short_dir: Path) -> None:
    path = short_dir / "prepare.lock"
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert (await holder.stdout.readline()).strip() == b"locked"
        lock = ClaimLock(path)
        entered = asyncio.Event()

        async def take() -> None:
            async with lock:
                entered.set()

        task = asyncio.create_task(take())
        await waiting_in_flock(path)
        assert not entered.is_set(), "lock taken while another process holds it"
        holder.stdin.write(b"\n")
        await holder.stdin.drain()
        await asyncio.wait_for(task, 5)
        assert entered.is_set()
        # released afterwards: a non-blocking lock succeeds
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


async def test_claim_lock_cancelled_waiter_releases(short_dir: Path) -> None:
    path = short_dir / "prepare.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description blocks flock
    lock = ClaimLock(path)
    task = asyncio.create_task(lock.__aenter__())
    await waiting_in_flock(path)  # cancelled while its thread waits in flock()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    # the abandoned thread gets the lock and must give it back promptly
    async with asyncio.timeout(5):
        async with lock:
            pass


@pytest.mark.parametrize(("pod_uid", "rolling"), [(None, False), ("", False), (UID, True)])
def test_one_rolling_update_mode(short_dir: Path, pod_uid: str | None, rolling: bool) -> None:
    """Sockets, shared checkpoint and cross-process lock follow one property:
    ``--pod-uid ""`` is plain mode for all three (it used to share the
    checkpoint without taking the file lock)."""
    from typing import cast

    from driver.kube.api import KubeApi
    from plugin.app import NodePlugin
    from plugin.settings import PluginSettings

    (short_dir / "boot_id").write_text("00000000-0000-4000-8000-000000000001\n")
    settings = PluginSettings(
        node_name="n",
        pod_uid=pod_uid,
        registry_dir=short_dir / "reg",
        plugin_dir=short_dir / "plug",
        cdi_root=short_dir / "cdi",
        boot_id_file=short_dir / "boot_id",
    )
    assert settings.rolling_update is rolling
    paths, preparer = NodePlugin(settings, cast(KubeApi, object()), []).claim_serving()
    assert (paths.dra.name != "dra.sock") is rolling
    assert preparer.shared_checkpoint is rolling
    assert preparer.lock.path == (paths.lock_file if rolling else None)
