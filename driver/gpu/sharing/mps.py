"""One MPS control daemon per claim's GPU set, outliving its starter.

The daemon is ``nvidia-cuda-mps-control -d`` (its path a setting,
``--mps-control``) with ``CUDA_VISIBLE_DEVICES`` set to the claim's GPUs and
its pipe and log directories under ``--mps-root/<claim uid>/``. Who calls
this: the MPS supervisor (a pod of its own, so a plugin rolling update leaves
the daemons running), or the plugin itself without one
(``driver.gpu.sharing.supervisor.converge`` either way). ``-d`` forks a
daemon in a session of its own, so it is not a child of its starter and
keeps serving running pods through a restart of that process; the daemon
writes ``nvidia-cuda-mps-control.pid`` into its pipe directory,
and we keep its pid and start time (``/proc/<pid>/stat`` field 22, so a
reused pid is never mistaken for it) in ``daemon.json`` beside it. A
restarted starter adopts a daemon that is still running; the claim's last
unprepare sends it ``quit`` through the control pipe (what NVIDIA's
scripts do), kills it if it does not go, and removes the directories.
Everything here is idempotent: the claim's checkpoint holds only the
directory, which is known before anything starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from driver.errors import DeviceError
from driver.faults import crash_point

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"
STATE_FILE = "daemon.json"
TIMEOUT_S = 10.0
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with its NUL
_POLL_S = 0.02


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


class MpsDaemons:
    """Starts, configures, adopts and stops the per-claim control daemons."""

    def __init__(self, control: Path, root: Path) -> None:
        self.control = control
        self.root = root

    def directory(self, claim_uid: str) -> Path:
        return self.root / claim_uid

    def dirs(self, directory: Path) -> tuple[Path, Path]:
        """(pipe, log) directories of a daemon."""
        return directory / "pipe", directory / "log"

    def _env(self, directory: Path, uuids: Sequence[str] = ()) -> dict[str, str]:
        pipe, logs = self.dirs(directory)
        env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
        env["CUDA_MPS_LOG_DIRECTORY"] = str(logs)
        if uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        return env

    def running(self, directory: Path) -> int | None:
        """The pid of this directory's daemon if it is alive (pid and start time match)."""
        try:
            state = json.loads((directory / STATE_FILE).read_text())
            pid, started = int(state["pid"]), int(state["start_time"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return pid if start_time(pid) == started else None

    def command(self, directory: Path, line: str) -> str:
        """Send one control command (``nvidia-cuda-mps-control`` reads stdin)."""
        try:
            done = subprocess.run(
                [str(self.control)], input=line + "\n", capture_output=True, text=True,
                env=self._env(directory), timeout=TIMEOUT_S, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeviceError(f"MPS control {line!r} in {directory}: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise DeviceError(f"MPS control {line!r} in {directory}: {why}")
        return done.stdout.strip()

    def ensure(
        self,
        directory: Path,
        uuids: Sequence[str],
        threads: int | None,
        pinned_mib: Mapping[str, int],
    ) -> int:
        """The running daemon of ``directory`` (adopted), else a new one; configured."""
        pid = self.running(directory)
        if pid is not None:
            log.info("MPS daemon %d of %s adopted", pid, directory.name)
        else:
            pid = self._start(directory, uuids)
        if threads is not None:
            self.command(directory, f"set_default_active_thread_percentage {threads}")
        for uuid, mib in pinned_mib.items():
            self.command(directory, f"set_default_device_pinned_mem_limit {uuid} {mib}M")
        return pid

    def _start(self, directory: Path, uuids: Sequence[str]) -> int:
        control = self.dirs(directory)[0] / "control"
        if len(str(control).encode()) > SOCKET_PATH_MAX:
            raise DeviceError(
                f"MPS pipe {control} is longer than a Unix socket path may be "
                f"({SOCKET_PATH_MAX} bytes): choose a shorter --mps-root"
            )
        self._kill_leftover(directory)
        for d in self.dirs(directory):
            d.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                [str(self.control), "-d"], env=self._env(directory, uuids),
                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=TIMEOUT_S, check=False, start_new_session=True,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeviceError(f"cannot start the MPS control daemon: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise DeviceError(f"MPS control daemon for {','.join(uuids)} failed: {why}")
        pid = self._daemon_pid(directory)
        crash_point("mps-daemon-started")
        started = start_time(pid)
        if started is None:
            raise DeviceError(f"MPS control daemon {pid} of {directory.name} exited at start")
        state = json.dumps({"pid": pid, "start_time": started, "uuids": list(uuids)})
        (directory / STATE_FILE).write_text(state)
        self.command(directory, "get_server_list")  # answers: it serves its pipe
        log.info("MPS daemon %d started for %s (%s)", pid, directory.name, ",".join(uuids))
        return pid

    def _daemon_pid(self, directory: Path) -> int:
        pid_file = self.dirs(directory)[0] / PID_FILE
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                return int(pid_file.read_text().strip())
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise DeviceError(f"MPS control daemon wrote no {pid_file}") from None
                time.sleep(_POLL_S)

    def _kill_leftover(self, directory: Path) -> None:
        """A daemon a crash left between its start and daemon.json (pid file
        only); a pid file whose daemon died goes too (a new one can start)."""
        pid_file = self.dirs(directory)[0] / PID_FILE
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if start_time(pid) is None:
            pid_file.unlink(missing_ok=True)
        elif _environ_has(pid, str(directory)):
            log.warning("killing MPS daemon %d left by an interrupted start", pid)
            os.kill(pid, signal.SIGKILL)

    def stop(self, directory: Path) -> None:
        """Quit the daemon (kill it if it stays) and remove its directories."""
        pid = self.running(directory)
        if pid is not None:
            try:
                self.command(directory, "quit")
            except DeviceError as exc:
                log.warning("MPS daemon %d: quit failed (%s); killing it", pid, exc)
            if not _gone(pid, start_time(pid), TIMEOUT_S):
                os.kill(pid, signal.SIGKILL)
            log.info("MPS daemon %d of %s stopped", pid, directory.name)
        else:
            self._kill_leftover(directory)
        crash_point("mps-daemon-stopped")
        shutil.rmtree(directory, ignore_errors=True)


def _gone(pid: int, started: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while started is not None and start_time(pid) == started:
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _environ_has(pid: int, text: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return text.encode() in environ
