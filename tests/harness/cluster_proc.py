"""Child processes of the local cluster: start, probe, stop, show logs.

Why this module exists: every component (etcd, the kube-* binaries, node
agents) is a long-lived child process that must log to a file in the run
directory, be found again by a later `cluster.py down` from another process,
and be stopped with its whole process group so nothing is left behind. One
small set of helpers does that for all of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.harness.ports import free_port as free_port  # where the harness takes ports

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


class ComponentError(RuntimeError):
    """A component exited or did not become ready; the message holds its log tail."""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: a test process killed with -9
    # must not leave control-plane processes behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file (empty if it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def set_aside(path: Path) -> Path | None:
    """Move an earlier process's log at ``path`` to the first free
    ``<path>.<n>`` (1, 2, ...: oldest first) and return where it went (None if
    there was none). A launcher object whose process is a new one (a new
    module's fabric or controller, not a restart) calls it, so the log at
    ``path`` holds only that process's lines while the earlier ones are kept
    for a post-mortem."""
    if not path.exists():
        return None
    n = 1
    while (kept := path.with_name(f"{path.name}.{n}")).exists():
        n += 1
    path.rename(kept)
    return kept


class Component:
    """One child process with its log file, started in its own process group."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, *, die_with_parent: bool, env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"--- start: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None,
            )
        log.info("started %s (pid %d), log %s", self.name, self.proc.pid, self.log_path)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ComponentError(
                f"{self.name} exited with status {self.proc.returncode}; "
                f"last lines of {self.log_path}:\n{tail(self.log_path)}"
            )

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        """Poll `probe` until it returns True; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(OSError, urllib.error.URLError, ssl.SSLError):
                if probe():
                    return
            time.sleep(0.2)
        raise ComponentError(
            f"{self.name} not ready after {timeout:.0f}s; "
            f"last lines of {self.log_path}:\n{tail(self.log_path)}"
        )


def https_ok(url: str, context: ssl.SSLContext) -> bool:
    """True when GET `url` answers 200 (with body 'ok' for health endpoints)."""
    with urllib.request.urlopen(url, context=context, timeout=2) as resp:
        return bool(resp.status == 200)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def stop_group(pid: int, name: str, timeout: float = 15.0) -> bool:
    """SIGTERM the process group led by `pid`, SIGKILL it after `timeout`.

    True when it ended on SIGTERM (or was gone already), False when it had to
    be killed: a launcher reports that as a failure of the component's stop.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return sig == signal.SIGTERM
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return sig == signal.SIGTERM
            time.sleep(0.1)
        log.warning("%s (pid %d) ignored %s", name, pid, sig.name)
    return False


def save_pids(path: Path, pids: dict[str, int]) -> None:
    path.write_text(json.dumps(pids, indent=1) + "\n", encoding="utf-8")


def load_pids(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(k): int(v) for k, v in data.items()}
