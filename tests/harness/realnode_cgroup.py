"""The cgroup subtree of one real node (tests/harness/realnode.py).

Why this module exists: each real node's kubelet runs with its own
``cgroupRoot`` (``/pb-<run>-<node>``) so that its pods' cgroups never mix
with another node's or the machine's, and so that the launcher can find and
remove all of them afterwards. Our machines use cgroup v1 (hybrid); the
kubelet requires ``cgroupRoot`` to exist in every hierarchy, and a v1
cpuset child is unusable until its ``cpus``/``mems`` are filled from the
parent. Removal goes leaf first, after every process inside was killed.
Concurrency: plain blocking calls.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")


def hierarchies() -> list[Path]:
    """Mounted cgroup hierarchies a kubelet uses (v1 controllers, or the v2 root)."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]
    out = []
    for entry in sorted(CGROUP_FS.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists():
            out.append(entry)
    return out


def create(root: str) -> None:
    """``root`` (e.g. ``/pb-0-node-a``) in every hierarchy, usable by the kubelet."""
    for h in hierarchies():
        path = h / root.strip("/")
        path.mkdir(exist_ok=True)
        if (h / "cpuset.cpus").exists():
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((h / knob).read_text())


def remove(root: str, timeout: float = 10.0) -> list[str]:
    """Remove ``root`` and everything below it (leaf first); paths left behind."""
    left = []
    for h in hierarchies():
        top = h / root.strip("/")
        if not top.exists():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, top]:
            deadline = time.monotonic() + timeout
            while d.exists():
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        left.append(str(d))
                        break
                    time.sleep(0.05)
    if left:
        log.warning("cgroups left behind: %s", ", ".join(left))
    return left


def pids_in(root: str) -> list[int]:
    """Processes in ``root`` or below, in any hierarchy."""
    pids: set[int] = set()
    for h in hierarchies():
        top = h / root.strip("/")
        if not top.exists():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)
