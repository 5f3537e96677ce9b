"""The simulated host's ``nvidia-cuda-mps-control``: daemon and client.

Enough of the real tool's interface for the driver and its tests:

- ``-d`` starts the control daemon for ``$CUDA_MPS_PIPE_DIRECTORY`` (and logs
  to ``$CUDA_MPS_LOG_DIRECTORY/control.log``): it forks twice into a session
  of its own, writes ``nvidia-cuda-mps-control.pid`` and listens on the
  ``control`` socket in the pipe directory; the command returns once the
  daemon serves. A second ``-d`` on a pipe directory whose daemon runs fails
  as the real one does ("An instance of this daemon is already running").
- Without ``-d`` it is the client: each line of stdin is one command sent
  to the daemon, its answer printed; no daemon: exit 1.
- Commands: ``get_server_list`` (no MPS servers run here: empty),
  ``set_default_active_thread_percentage <1-100>`` /
  ``get_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit <dev> <n>M``, ``quit``.

The daemon keeps what it was told (and ``CUDA_VISIBLE_DEVICES``) in
``standin-state.json`` in its log directory, and logs each start and
command, so tests can see the daemon a claim got.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, logs


def _alive(pipe: Path) -> bool:
    """Whether the pid file names a live process (a zombie is not one)."""
    try:
        stat = Path(f"/proc/{int((pipe / PID_FILE).read_text())}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class Daemon:
    def __init__(self, pipe: Path, logs: Path) -> None:
        self.pipe, self.logs = pipe, logs
        self.state: dict[str, object] = {
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "active_thread_percentage": 100,
            "pinned_mem_limits": {},
        }

    def log(self, line: str) -> None:
        with (self.logs / "control.log").open("a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")

    def save(self) -> None:
        (self.logs / "standin-state.json").write_text(json.dumps(self.state))

    def handle(self, line: str) -> tuple[str, bool]:
        """(answer, quit) for one command."""
        words = line.split()
        self.log(f"CMD {line}")
        if not words:
            return "", False
        cmd, args = words[0], words[1:]
        if cmd == "quit":
            return "", True
        if cmd == "get_server_list":
            return "", False
        if cmd == "get_default_active_thread_percentage":
            return f"{float(str(self.state['active_thread_percentage'])):.1f}", False
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            if not args[0].isdigit() or not 1 <= int(args[0]) <= 100:
                return f"Invalid active thread percentage {args[0]}", False
            self.state["active_thread_percentage"] = int(args[0])
            self.save()
            return f"{float(args[0]):.1f}", False
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            limits = self.state["pinned_mem_limits"]
            assert isinstance(limits, dict)
            limits[args[0]] = args[1]
            self.save()
            return "", False
        return f"Unrecognized command {line!r}", False

    def serve(self, ready: int) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            (self.pipe / SOCKET).unlink()
        server.bind(str(self.pipe / SOCKET))
        server.listen(8)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        self.save()
        self.log(f"Startup (pid {os.getpid()}, devices {self.state['visible_devices']})")
        os.write(ready, b"1")
        os.close(ready)
        while True:
            conn, _ = server.accept()
            with conn, conn.makefile("rw") as stream:
                for line in stream:
                    answer, stop = self.handle(line.strip())
                    stream.write(answer + "\n")
                    stream.flush()
                    if stop:
                        self.log("Shutdown")
                        (self.pipe / SOCKET).unlink(missing_ok=True)
                        (self.pipe / PID_FILE).unlink(missing_ok=True)
                        os._exit(0)


def start_daemon() -> int:
    pipe, logs = _dirs()
    if _alive(pipe):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    if os.fork() > 0:  # the command: return once the daemon serves
        os.close(write_end)
        ok = os.read(read_end, 1) == b"1"
        return 0 if ok else 1
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        Daemon(pipe, logs).serve(write_end)
    finally:
        os._exit(1)


def client() -> int:
    pipe, _ = _dirs()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(pipe / SOCKET))
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with conn, conn.makefile("rw") as stream:
        for line in sys.stdin:
            stream.write(line.strip() + "\n")
            stream.flush()
            answer = stream.readline()
            if answer.strip():
                print(answer.strip())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return start_daemon() if "-d" in args else client()


if __name__ == "__main__":
    sys.exit(main())
