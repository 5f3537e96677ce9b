"""A real Kubernetes control plane on loopback, for e2e tests and the demo.

Why this module exists: patchbay's cluster behaviour (slices the apiserver
accepts, claims the scheduler allocates, claims created from templates) must
be tested against the real components, and our machines have no Docker. This
launcher runs etcd, kube-apiserver, kube-scheduler and kube-controller-manager
(built by `make k8s-bins` from the release pinned in hack/k8s/go.mod) as child
processes on free 127.0.0.1 ports, with client-certificate authentication,
`Node,RBAC` authorization and the DRA feature gates on.

Python API: `LocalCluster(run_dir).up()`, `.kubeconfig`, `.server`,
`.kubeconfig_for(...)`, `.node_kubeconfig(node)`, `.down()`; node agents:
`NodeAgent(cluster, node_name).start()` / `.stop()` (tests/harness/cluster_agent.py).
CLI: `python hack/cluster.py up|down|status [--dir run/cluster]`; `up`
leaves the processes running (detached) until `down`.
Concurrency: plain blocking calls; the components are separate processes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.harness.cluster_agent import NodeAgent
from tests.harness.cluster_argv import FEATURE_GATES, RUNTIME_CONFIG, ControlPlaneArgv
from tests.harness.cluster_pki import Pki, write_kubeconfig
from tests.harness.cluster_proc import (
    Component,
    ComponentError,
    free_port,
    https_ok,
    load_pids,
    pid_alive,
    save_pids,
    stop_group,
    tail,
)

__all__ = ["ComponentError", "LocalCluster", "NodeAgent", "PrerequisiteError", "bin_dir"]

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


class PrerequisiteError(RuntimeError):
    """Something the cluster needs (Go, make, openssl, a built binary) is missing."""


def bin_dir(*, build: bool = False) -> Path:
    """The cached binary dir (`$PATCHBAY_K8S_BIN_DIR` or `make k8s-bin-dir`), built if asked."""
    override = os.environ.get("PATCHBAY_K8S_BIN_DIR")
    if override:
        return Path(override)
    if shutil.which("make") is None:
        raise PrerequisiteError("'make' is required to locate the control-plane binaries")
    mk = ["make", "-s", "--no-print-directory", "-C", str(REPO), "-f", "hack/k8s.mk"]
    if build:
        proc = subprocess.run([*mk, "k8s-bins"], check=False)
        if proc.returncode != 0:
            raise PrerequisiteError("`make k8s-bins` failed (see its output above)")
    out = subprocess.run([*mk, "k8s-bin-dir"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise PrerequisiteError(f"`make k8s-bin-dir` failed: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def missing_binaries(directory: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(directory / b, os.X_OK)]


class LocalCluster:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager on loopback."""

    def __init__(
        self,
        run_dir: Path | str,
        binaries: Path | None = None,
        *,
        address: str = "127.0.0.1",
        audit: bool = False,
        gates: Mapping[str, bool] | None = None,
        runtime_config: Sequence[str] = (),
        profiling: bool = False,
    ) -> None:
        """``address``: where the apiserver listens and what it advertises; real
        nodes (tests/harness/realnode.py) need one their network namespaces reach.
        ``audit``: the apiserver logs every request's metadata to
        :attr:`audit_log` (JSON lines; tests count requests per client).
        ``gates``, ``runtime_config``: set on top of :data:`FEATURE_GATES` and
        :data:`RUNTIME_CONFIG` (apiserver, scheduler, controller-manager; real
        nodes' kubelets take :attr:`gates` too), for a tier of its own only
        (tests/gated): every other tier keeps 1.37's default gates.
        ``profiling``: the scheduler serves ``/debug/pprof`` (the scale bench's
        profile, ``tests/bench/scale_profile.py``); off everywhere else."""
        self.profiling = profiling
        self.gates = dict.fromkeys(FEATURE_GATES, True) | dict(gates or {})
        self.runtime_config = ",".join((RUNTIME_CONFIG, *runtime_config))
        self.run_dir = Path(run_dir).resolve()
        self.audit_log = self.run_dir / "audit.log" if audit else None
        self.binaries = binaries
        self.address = address
        self.pki = Pki(self.run_dir / "pki")
        self.kubeconfig = self.run_dir / "admin.kubeconfig"
        self.components: list[Component] = []
        self._ready: dict[str, Callable[[], bool]] = {}  # each component's readiness probe
        self.startup_seconds: float | None = None
        self.server = ""
        self._state = self.run_dir / "state.json"
        if self._state.exists():  # a cluster started earlier (e.g. by the CLI)
            state = json.loads(self._state.read_text())
            self.server = state["server"]
            self.address = state.get("address", address)
            if self.binaries is None and state.get("binaries"):
                self.binaries = Path(state["binaries"])

    # -- identities ---------------------------------------------------------

    def kubeconfig_for(self, name: str, common_name: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for the identity CN=`common_name`, O=`groups`."""
        pair = self.pki.issue(name, common_name, groups)
        path = self.run_dir / "kubeconfigs" / f"{name}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_kubeconfig(path, self.server, self.pki.ca.cert, pair, common_name)

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubelet-style identity: CN=system:node:<name>, O=system:nodes."""
        return self.kubeconfig_for(
            f"node-{node_name}", f"system:node:{node_name}", ("system:nodes",)
        )

    # -- lifecycle ------------------------------------------------------------

    def up(self, *, timeout: float = 180.0, detach: bool = False) -> LocalCluster:
        """Start everything and wait until ready; on failure stop what started."""
        binaries = self.binaries = self.binaries or bin_dir()
        missing = missing_binaries(binaries)
        if missing:
            raise PrerequisiteError(
                f"missing in {binaries}: {', '.join(missing)}; run `make k8s-bins`"
            )
        if load_pids(self._pids_path()):
            self.down()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        try:
            self._start(binaries, timeout, detach=detach)
        except BaseException:
            self.down()
            raise
        self.startup_seconds = time.monotonic() - start
        log.info("control plane ready at %s in %.1fs", self.server, self.startup_seconds)
        return self

    def _pids_path(self) -> Path:
        return self.run_dir / "pids.json"

    def _spawn(self, name: str, argv: list[str], *, detach: bool) -> Component:
        comp = Component(name, argv, self.run_dir / "logs" / f"{name}.log")
        comp.start(die_with_parent=not detach)
        self.components.append(comp)
        save_pids(self._pids_path(), {c.name: c.pid for c in self.components if c.pid})
        return comp

    def _start(self, bins: Path, timeout: float, *, detach: bool) -> None:
        self.pki.init()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.server = f"https://{self.address}:{api_port}"
        state = {"server": self.server, "binaries": str(bins), "address": self.address}
        self._state.write_text(json.dumps(state) + "\n")
        argv = ControlPlaneArgv(
            self.run_dir, self.pki, bins, self.address,
            ",".join(f"{g}={str(on).lower()}" for g, on in self.gates.items()),
            self.runtime_config, self.audit_log, self.profiling,
        )  # fmt: skip
        etcd = self._spawn("etcd", argv.etcd(etcd_port, peer_port), detach=detach)
        self._ready["etcd"] = lambda: _http_ok(f"http://127.0.0.1:{etcd_port}/health")
        etcd.wait_ready(self._ready["etcd"], timeout)
        api = self._spawn("kube-apiserver", argv.apiserver(etcd_port, api_port), detach=detach)
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        admin = self.pki.issue("admin", "patchbay-admin", ("system:masters",))
        ctx.load_cert_chain(str(admin.cert), str(admin.key))
        self._ready["kube-apiserver"] = lambda: https_ok(f"{self.server}/readyz", ctx)
        api.wait_ready(self._ready["kube-apiserver"], timeout)
        write_kubeconfig(self.kubeconfig, self.server, self.pki.ca.cert, admin, "patchbay-admin")
        insecure = ssl._create_unverified_context()  # self-signed serving certs of kcm/scheduler
        waits = []
        for name, user in (
            ("kube-controller-manager", "system:kube-controller-manager"),
            ("kube-scheduler", "system:kube-scheduler"),
        ):
            kubeconfig = self.kubeconfig_for(name, user)
            port = free_port()
            line = (
                argv.controller_manager(kubeconfig, port)
                if name.endswith("manager")
                else argv.scheduler(kubeconfig, port)
            )
            waits.append((self._spawn(name, line, detach=detach), port))
        for comp, port in waits:
            comp.wait_ready(
                functools.partial(https_ok, f"https://127.0.0.1:{port}/healthz", insecure), timeout
            )

    def pids(self) -> dict[str, int]:
        return load_pids(self._pids_path())

    def _component(self, name: str) -> Component:
        for comp in self.components:
            if comp.name == name:
                return comp
        raise KeyError(f"{name} is not a component this LocalCluster started")

    def stop(self, name: str) -> None:
        """Kill one component (an outage); its ports, data and identity stay for
        :meth:`start`. Only components this object started (not a detached CLI's)."""
        comp = self._component(name)
        if comp.proc is not None:  # SIGKILL, like a crash (the apiserver drains for 15 s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(comp.proc.pid, signal.SIGKILL)
            comp.proc.wait(timeout=10)

    def start(self, name: str, timeout: float = 60.0) -> None:
        """Start a component :meth:`stop` stopped, with its old arguments; wait until ready."""
        comp = self._component(name)
        comp.start(die_with_parent=True)
        save_pids(self._pids_path(), {c.name: c.pid for c in self.components if c.pid})
        probe = self._ready.get(name)
        if probe is not None:
            comp.wait_ready(probe, timeout)

    def down(self) -> list[str]:
        """Stop every component (reverse start order) with its process group;
        the names of those that ignored SIGTERM and had to be killed."""
        pids = self.pids()
        killed = [name for name in reversed(list(pids)) if not stop_group(pids[name], name)]
        for comp in self.components:
            if comp.proc is not None:
                comp.proc.wait(timeout=10)
        self.components.clear()
        self._pids_path().unlink(missing_ok=True)
        return killed

    def status(self) -> dict[str, bool]:
        return {name: pid_alive(pid) for name, pid in self.pids().items()}

    def log_tails(self, lines: int = 30) -> str:
        parts = [
            f"== {p.name}\n{tail(p, lines)}" for p in sorted((self.run_dir / "logs").glob("*.log"))
        ]
        return "\n".join(parts)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", default=str(REPO / "run" / "cluster"), help="run directory")
    parser.add_argument("--build", action="store_true", help="run `make k8s-bins` first")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cluster = LocalCluster(args.dir)
    if args.command == "up":
        cluster.binaries = bin_dir(build=args.build)
        try:
            cluster.up(detach=True)
        except (ComponentError, PrerequisiteError) as err:
            print(f"cluster up failed: {err}", file=sys.stderr)
            return 1
        print(f"ready in {cluster.startup_seconds:.1f}s: export KUBECONFIG={cluster.kubeconfig}")
    elif args.command == "down":
        cluster.down()
        print("stopped")
    else:
        status = cluster.status()
        for name, alive in status.items():
            print(f"{name:26} {'running' if alive else 'stopped'}")
        print(f"server {cluster.server or '-'}  kubeconfig {cluster.kubeconfig}")
        return 0 if status and all(status.values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
