"""The scheduler's own CPU profile over bursts of pods (issue 34, step 3).

Why: without the fabric pool a whole-GPU pod still costs the scheduler about
ten times a plain one at 500 nodes, and where that time goes inside
kube-scheduler (the allocator's pool gathering, CEL selectors, device
order, counters) is read in its own pprof, not guessed. The harness starts
kube-scheduler with ``--profiling=false``; the scale bench starts its
control plane with ``profiling=True`` (``tests.harness.cluster``) and, with
``--profile SECONDS``, fetches ``/debug/pprof/profile`` from the
scheduler's secure port (an admin client certificate: the scheduler
authorizes it through the apiserver) while bursts of one kind run back to
back, then prints ``go tool pprof -top``'s first frames, flat and
cumulative, and keeps the profile beside the run's logs.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.harness import cluster as localk8s

GO = "/usr/local/go/bin/go"  # where the build's Go is installed
FRAMES = 25


def secure_port(pid: int) -> int:
    for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
        if arg.startswith(b"--secure-port="):
            return int(arg.split(b"=", 1)[1])
    raise RuntimeError(f"process {pid} was started without --secure-port")


def fetch(cluster: localk8s.LocalCluster, pid: int, seconds: int, out: Path) -> None:
    """The scheduler's CPU profile over the next ``seconds``, written to ``out``."""
    pair = cluster.pki.issue("bench-pprof", "patchbay-admin", ("system:masters",))
    ctx = ssl._create_unverified_context()  # the scheduler's self-signed serving cert
    ctx.load_cert_chain(str(pair.cert), str(pair.key))
    url = f"https://127.0.0.1:{secure_port(pid)}/debug/pprof/profile?seconds={seconds}"
    with urllib.request.urlopen(url, timeout=seconds + 60, context=ctx) as resp:
        out.write_bytes(resp.read())


def top(binary: Path, profile: Path, cumulative: bool) -> str:
    go = shutil.which("go") or GO
    argv = [go, "tool", "pprof", "-top", f"-nodecount={FRAMES}"]
    argv += ["-cum"] if cumulative else []
    env = {**os.environ, "PPROF_TMPDIR": str(profile.parent)}
    proc = subprocess.run(
        [*argv, str(binary), str(profile)], capture_output=True, text=True, env=env, check=False
    )
    return proc.stdout if proc.returncode == 0 else f"pprof failed: {proc.stderr[-500:]}"


def profiled(
    cluster: localk8s.LocalCluster, pid: int, seconds: int, out: Path, work: Callable[[], object]
) -> str:
    """Run ``work`` again and again while a ``seconds`` profile is taken; the top frames."""
    failed: list[BaseException] = []

    def take() -> None:
        try:
            fetch(cluster, pid, seconds, out)
        except Exception as err:  # printed below, the run goes on
            failed.append(err)

    taker = threading.Thread(target=take, name="pprof", daemon=True)
    taker.start()
    while taker.is_alive():
        work()
    taker.join()
    if failed:
        return f"  profile failed: {failed[0]!r}"
    binary = Path(cluster.binaries or localk8s.bin_dir()) / "kube-scheduler"
    flat, cum = top(binary, out, False), top(binary, out, True)
    return f"  profile {out}:\n{flat}\n  cumulative:\n{cum}"
