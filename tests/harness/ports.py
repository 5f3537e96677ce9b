"""Loopback TCP ports for the components a test run starts, without a race.

Why this module exists: the cluster tiers run in parallel pytest-xdist
workers, each starting its own etcd, apiserver, scheduler, plugins and
webhooks on ports it must choose before the component binds them. Asking
the kernel for an ephemeral port (bind to 0, close, hand the number over)
is check-then-use: until the component binds it, the same number can be
handed to another worker's bind to 0, or to any outgoing connection.

So each process takes ports from a block of its own below the kernel's
ephemeral range (``net.ipv4.ip_local_port_range``), where the kernel never
hands out a port by itself: an xdist worker the block of its index (gw0,
gw1, ...), any other process (a plain pytest run, the demo, a benchmark)
one chosen by its pid. Within a block ports are taken in turn and never
twice while unused ones remain; each is checked with a bind first, for a
port some unrelated program holds.

Two runs on one machine (a CI clone's beside a developer's) have the same
worker names: both gw0 took the same block, chose the same port and one
controller failed to bind its metrics port. So a process holds its block
for its lifetime by binding an abstract Unix socket named after it
(:data:`LOCK_NAME`: exclusive, no file left behind, released by the kernel
when the process ends), and takes the next free block when another process
holds its own.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

FIRST = 20000  # the pool: FIRST up to the ephemeral range's start
BLOCKS = 16  # xdist workers gw0..gw7 and 8 blocks for other processes
LOCK_NAME = "patchbay-ports"  # abstract socket name prefix: one bound per held block
_lock = threading.Lock()
_state: dict[str, itertools.cycle[int]] = {}
_held: dict[str, socket.socket] = {}  # pid -> the socket holding its block (kept open)


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def preferred_block() -> int:
    """The block this process tries first: its xdist worker number, else one its pid picks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < BLOCKS // 2:
        return int(worker[2:])
    return BLOCKS // 2 + os.getpid() % (BLOCKS // 2)


def claim_block(preferred: int, namespace: str = LOCK_NAME) -> tuple[int, socket.socket | None]:
    """(the block, the socket that holds it): ``preferred`` unless another
    process holds it, then the next one free; ``preferred`` unheld (None)
    when every block is held."""
    for i in range(BLOCKS):
        block = (preferred + i) % BLOCKS
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            holder.bind(f"\0{namespace}-{block}")
        except OSError:  # another process holds it
            holder.close()
            continue
        return block, holder
    return preferred, None


def _ports() -> itertools.cycle[int]:
    key = f"{os.getpid()}"  # a forked child starts its own turn
    if key not in _state:
        size = max(16, (_ephemeral_start() - FIRST) // BLOCKS)
        block, holder = claim_block(preferred_block())
        if holder is not None:
            _held[key] = holder
        start = FIRST + block * size
        _state[key] = itertools.cycle(range(start, start + size))
    return _state[key]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no other process of the run will be given."""
    with _lock:
        ports = _ports()
        for _ in range(65536):
            port = next(ports)
            if _bindable(port):
                return port
    raise OSError("no free port left in this process's block")
