"""Measuring a kubelet plugin the way the kubelet calls it, whichever driver.

A :class:`Contender` is one running plugin process (ours or the reference
driver's) with pre-made allocated claims for its pool. The bench plays the
kubelet: one NodePrepareResources then one NodeUnprepareResources per pair,
over the plugin's real socket, timed at the caller, on one gRPC channel per
plugin for the whole run, as the kubelet keeps one per registered plugin
(``grpc.NewClient`` at registration, connecting on demand, closed after
grpc-go's default idle timeout of 30 minutes); the plugin's CPU time is
read from ``/proc/<pid>/stat`` around each round. Syscalls (fsyncs among
them) are counted in a separate, untimed phase with ``strace -f -c``
attached to every thread (its tracing slows the process; none of those
pairs is timed): :func:`syscall_table` prints them per pair. Figures only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from kubernetes import client

from plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc, registration_pb2, registration_pb2_grpc
from tests.kube.claims import allocated_claim

TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) / 1024 if match else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process, all its threads, so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def write_syscalls(pid: int) -> int:
    match = re.search(r"syscw:\s+(\d+)", Path(f"/proc/{pid}/io").read_text())
    return int(match.group(1)) if match else 0


def registered_endpoint(registry_dir: Path, pid: int, timeout: float = 60.0) -> str:
    """The DRA socket a plugin registered (GetInfo on its registration socket)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            break
        for sock in registry_dir.glob("*.sock"):
            try:
                with grpc.insecure_channel(f"unix://{sock}") as ch:
                    info = registration_pb2_grpc.RegistrationStub(ch).GetInfo(
                        registration_pb2.InfoRequest(), timeout=1
                    )
                    return str(info.endpoint)
            except grpc.RpcError:
                pass
        time.sleep(0.2)
    raise RuntimeError(f"plugin {pid} did not register in {registry_dir}")


@dataclass
class Contender:
    label: str
    pid: int
    endpoint: str
    driver: str
    pool: str
    namespace: str
    claims: list[tuple[str, str]] = field(default_factory=list)  # (name, uid), unused
    prepare_ms: list[float] = field(default_factory=list)
    unprepare_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    rss_start_mb: float = 0.0
    fsyncs_per_pair: float | None = None
    fsync_method: str = ""
    syscalls_per_pair: dict[str, float] = field(default_factory=dict)  # strace's names
    _channel: grpc.Channel | None = field(default=None, repr=False)

    def _stub(self) -> dra_v1_pb2_grpc.DRAPluginStub:
        """The stub on the run's one channel (module docstring)."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.endpoint}")
        return dra_v1_pb2_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def make_claims(self, api: client.ResourceV1Api, count: int) -> None:
        base = len(self.claims)
        for i in range(base, base + count):
            name = f"{self.pool}-c{i}"
            uid = allocated_claim(
                api, self.namespace, name, self.pool, ["gpu-0"], driver=self.driver
            )
            self.claims.append((name, uid))

    def hold(self, api: client.ResourceV1Api, devices: Sequence[str]) -> None:
        """Prepare one claim per device and keep them prepared (the idle figure:
        a plugin at rest with claims prepared)."""
        stub = self._stub()
        for device in devices:
            name = f"{self.pool}-held-{device}"
            uid = allocated_claim(
                api, self.namespace, name, self.pool, [device], driver=self.driver
            )
            claim = [dra_v1_pb2.Claim(namespace=self.namespace, name=name, uid=uid)]
            out = stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=claim), timeout=45
            )
            if out.claims[uid].error:
                raise RuntimeError(f"{self.label}: prepare failed: {out.claims[uid].error}")

    def _pair(self, stub: dra_v1_pb2_grpc.DRAPluginStub) -> tuple[float, float]:
        name, uid = self.claims.pop(0)
        claim = [dra_v1_pb2.Claim(namespace=self.namespace, name=name, uid=uid)]
        t0 = time.perf_counter()
        out = stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=claim), timeout=45
        )
        t1 = time.perf_counter()
        if out.claims[uid].error:
            raise RuntimeError(f"{self.label}: prepare failed: {out.claims[uid].error}")
        done = stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claim), timeout=45
        )
        t2 = time.perf_counter()
        if done.claims[uid].error:
            raise RuntimeError(f"{self.label}: unprepare failed: {done.claims[uid].error}")
        return (t1 - t0) * 1000, (t2 - t1) * 1000

    def run(self, pairs: int, *, record: bool = True) -> None:
        """``pairs`` prepare+unprepare pairs, one after the other."""
        stub = self._stub()
        cpu = cpu_seconds(self.pid)
        for _ in range(pairs):
            prep, unprep = self._pair(stub)
            if record:
                self.prepare_ms.append(prep)
                self.unprepare_ms.append(unprep)
        if record:
            self.cpu_s += cpu_seconds(self.pid) - cpu

    def count_fsyncs(self, pairs: int) -> None:
        """Every syscall per pair, all threads (strace), untimed; fsyncs are
        fsync + fdatasync."""
        strace = shutil.which("strace")
        if strace is None:  # an approximation only: every write syscall counts
            before = write_syscalls(self.pid)
            self.run(pairs, record=False)
            self.fsyncs_per_pair = (write_syscalls(self.pid) - before) / pairs
            self.fsync_method = "write syscalls (/proc/pid/io syscw; no strace)"
            return
        with tempfile.NamedTemporaryFile(prefix="strace-", suffix=".txt") as out:
            tracer = subprocess.Popen(
                [strace, "-f", "-c", "-o", out.name, "-p", str(self.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                _wait_traced(self.pid)
                self.run(pairs, record=False)
            finally:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(timeout=30)
            summary = Path(out.name).read_text()
        calls = {
            m.group(2): int(m.group(1)) / pairs
            for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$",
                                 summary, re.MULTILINE)
            if m.group(2) != "total"
        }  # fmt: skip
        self.syscalls_per_pair = calls
        self.fsyncs_per_pair = calls.get("fsync", 0.0) + calls.get("fdatasync", 0.0)
        self.fsync_method = "strace -f -c"

    def row(self) -> dict[str, float]:
        pairs = len(self.prepare_ms)
        return {
            "prepare median ms": statistics.median(self.prepare_ms),
            "prepare p99 ms": percentile(self.prepare_ms, 0.99),
            "unprepare median ms": statistics.median(self.unprepare_ms),
            "unprepare p99 ms": percentile(self.unprepare_ms, 0.99),
            "plugin CPU per pair ms": self.cpu_s * 1000 / pairs,
            "RSS after start MB": self.rss_start_mb,
            "RSS at end MB": rss_mb(self.pid),
            "fsyncs per pair": (
                self.fsyncs_per_pair if self.fsyncs_per_pair is not None else float("nan")
            ),
        }


def _wait_traced(pid: int, timeout: float = 10.0) -> None:
    """Until strace has attached to every thread of ``pid``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        tracers = [re.search(r"TracerPid:\s+(\d+)", (t / "status").read_text()) for t in tasks]
        if tasks and all(m is not None and m.group(1) != "0" for m in tracers):
            time.sleep(0.2)  # threads the attach raced with
            return
        time.sleep(0.05)
    raise RuntimeError(f"strace did not attach to {pid}")


class Runs(Protocol):
    """What takes turns in :func:`alternate`: a contender, or the floors
    (``tests.bench.floors``)."""

    def run(self, pairs: int) -> None: ...


def alternate(contenders: Sequence[Runs], pairs: int, round_size: int) -> None:
    """``pairs`` timed pairs each, in rounds of ``round_size``, the contenders
    taking turns (and the first of a round changing each round), so that
    whatever else the machine does falls on all of them alike."""
    rounds = max(1, pairs // round_size)
    turns = list(contenders)
    for r in range(rounds):
        order = turns[r % len(turns) :] + turns[: r % len(turns)]
        for c in order:
            c.run(round_size)


def syscall_table(contenders: list[Contender], top: int = 12) -> str:
    """Syscalls per prepare + unprepare pair, each contender's (strace -f -c,
    while a waiting thread's polls count too), the most frequent first."""
    names = sorted(
        {n for c in contenders for n in c.syscalls_per_pair},
        key=lambda n: -max(c.syscalls_per_pair.get(n, 0.0) for c in contenders),
    )
    if not names:
        return "syscalls per pair: not counted (no strace)"
    width = max(len(n) for n in [*names[:top], "all syscalls"])
    heads = [c.label for c in contenders]
    out = ["  ".join(["syscalls per pair".ljust(width), *(h.rjust(8) for h in heads)])]
    for n in [*names[:top], "all syscalls"]:
        cells = [
            sum(c.syscalls_per_pair.values())
            if n == "all syscalls"
            else c.syscalls_per_pair.get(n, 0.0)
            for c in contenders
        ]
        out.append("  ".join([n.ljust(width), *(f"{v:.1f}".rjust(8) for v in cells)]))
    return "\n".join(out)


def table(contenders: list[Contender], ratio_to: list[str]) -> str:
    """The side-by-side table, with ours/theirs ratios for the labels given."""
    rows = {c.label: c.row() for c in contenders}
    ours = contenders[0].label
    heads = [c.label for c in contenders] + [f"{ours}/{t}" for t in ratio_to]
    width = max(len(k) for k in next(iter(rows.values())))
    cols = [max(len(h), 8) for h in heads]
    out = ["  ".join([" " * width, *(h.rjust(w) for h, w in zip(heads, cols, strict=True))])]
    for key in rows[ours]:
        cells = [f"{rows[c.label][key]:.2f}" for c in contenders]
        for t in ratio_to:
            theirs = rows[t][key]
            cells.append(f"{rows[ours][key] / theirs:.2f}" if theirs else "-")
        out.append(
            "  ".join([key.ljust(width), *(x.rjust(w) for x, w in zip(cells, cols, strict=True))])
        )
    return "\n".join(out)


def round_spread(contenders: list[Contender], ratio_to: list[str], round_size: int) -> str:
    """How ours/theirs moves from round to round: the ratio of each round's
    medians (a round's pairs ran back to back, the contenders' rounds next
    to one another), min / median / max over the rounds."""
    ours = contenders[0]
    by_label = {c.label: c for c in contenders}
    lines = []
    for figure in ("prepare_ms", "unprepare_ms"):
        cells = []
        for t in ratio_to:
            mine, theirs = getattr(ours, figure), getattr(by_label[t], figure)
            ratios = [
                statistics.median(mine[i : i + round_size])
                / statistics.median(theirs[i : i + round_size])
                for i in range(0, min(len(mine), len(theirs)), round_size)
            ]
            if ratios:
                cells.append(
                    f"{ours.label}/{t} {min(ratios):.2f} / {statistics.median(ratios):.2f}"
                    f" / {max(ratios):.2f}"
                )
        lines.append(f"{figure[:-3]} median per round, min / median / max over the rounds: "
                     + ", ".join(cells))  # fmt: skip
    return "\n".join(lines)
