"""Start the simulated fabric service and the controller for tests and demos.

Why this module exists: the fabric e2e tests and the benchmark need a real
``patchbay-fabric`` wired to the simulated hosts of their SimNodes, and a
real ``patchbay-controller`` process running with its own identity (bound to
hack/rbac/controller.yaml), both killable and restartable like in the field.
The fabric serves HTTPS with a certificate from a CA this launcher makes
(``tests.harness.cluster_pki``; the controller verifies it with ``--fabric-ca-bundle``)
and both read the bearer token from one file, which :meth:`rotate_token`
rewrites (rotation without a restart).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.harness.cluster_pki import Pki
from tests.harness.cluster_proc import set_aside, stop_group, tail

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_GROUP = "patchbay:controllers"


def switch(
    ident: str,
    upstream: list[tuple[str, str, Path]],
    gpus: Sequence[str],
    nics: Sequence[str] = (),
    nvmes: Sequence[str] = (),
    cxlmems: Sequence[str] = (),
    lds: int = 1,
    vppbs: int | None = None,
) -> dict[str, Any]:
    """One switch: upstream (node, adapter, host dir) ports, then slots for GPUs,
    NICs (ConnectX PFs with 4 VFs), NVMe drives (3.84 TB) and CXL Type 3 memory
    (64 GiB; only on a fabric of type CXL, :class:`FabricService`'s ``spec``
    sets it; ``lds`` above 1: each a multi-logical device of that many LDs,
    endpoints ``<id>-ld<k>``). Serials derive from the device ids (the
    simulator's defaults). ``vppbs``: each upstream port's room (its virtual
    switch's vPPBs; none: no limit)."""
    devices: list[dict[str, Any]] = [
        {"kind": "gpu", "id": g, "model": "H100-SXM5-80GB"} for g in gpus
    ]
    devices += [
        {"kind": "nic", "id": n, "netdev": f"fab{i}f0", "totalVfs": 4, "numVfs": 4}
        for i, n in enumerate(nics)
    ]
    devices += [{"kind": "nvme", "id": d} for d in nvmes]
    devices += [
        {"kind": "cxlmem", "id": m, "memoryMiB": 64 * 1024, "logicalDevices": lds} for m in cxlmems
    ]
    return {
        "id": ident,
        "upstream": [
            {"port": f"up{i}", "node": n, "adapter": a, "hostDir": str(d)}
            | ({"vppbs": vppbs} if vppbs else {})
            for i, (n, a, d) in enumerate(upstream)
        ],
        "slots": [{"port": f"slot{i}", "device": dev} for i, dev in enumerate(devices)],
    }


# The names the fabric's certificate carries (the launcher serves on loopback).
SERVER_SANS = ("DNS:localhost", "IP:127.0.0.1")


class _Proc:
    """A launched process and its log. A new object is a new process (a new
    module's fabric or controller): the log an earlier one left at
    ``log_path`` is set aside, so this one's log holds only its own lines (an
    xdist worker runs many modules in one run directory, and a test that
    counts lines in the log must not count an earlier module's). ``start()``
    after ``stop()`` is a restart of the same process: its log goes on."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        set_aside(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}  # added to the process's environment

    def _spawn(self, argv: list[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(REPO), **self.env)
        with self.log_path.open("ab") as out:
            out.write(f"--- start: {' '.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=REPO, start_new_session=True,
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, like a crash."""
        if self.alive and self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive and self.proc is not None:
            stop_group(self.proc.pid, self.name)
            self.proc.wait(timeout=15)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


class FabricService(_Proc):
    """A ``patchbay-fabric`` process with its database under ``directory``."""

    def __init__(
        self, directory: Path, spec: dict[str, Any], token: str = "s3cret", insecure: bool = False
    ) -> None:
        super().__init__("fabric", directory / "fabric.log")
        self.dir = directory
        self.insecure = insecure
        directory.mkdir(parents=True, exist_ok=True)
        self.token_file = directory / "token"
        self.rotate_token(token)
        pki = Pki(directory / "pki")
        pki.init()
        self.ca_bundle = pki.ca.cert
        self.cert = pki.issue("fabric", "patchbay-fabric", server_sans=SERVER_SANS)
        # A new FabricService is a new fabric: a database an earlier one left in
        # this directory (a test that failed with a device still attached, a
        # fault knob still set) must not be inherited. start() after stop()
        # keeps the state: that is a restart of the same fabric.
        self.db = directory / "fabric.db"
        for leftover in (self.db, *directory.glob("fabric.db-*")):
            leftover.unlink(missing_ok=True)
        self.topology = directory / "fabric.json"
        self.topology.write_text(json.dumps({"fabrics": [{"id": "pcie0", "type": "PCIe", **spec}]}))
        self.port_file = directory / "port"
        self.port = 0  # 0 picks one; a restart keeps the first one (clients keep their URL)
        self.url = ""

    def rotate_token(self, token: str) -> None:
        """Write a new token; the fabric and its clients use it from their next request."""
        self.token = token
        tmp = self.token_file.with_suffix(".tmp")
        tmp.write_text(token + "\n")
        tmp.replace(self.token_file)  # atomic, like the kubelet's Secret volume swap

    def tls_args(self) -> list[str]:
        """How a client of this fabric verifies it (or is told not to)."""
        if self.insecure:
            return ["--fabric-insecure=true"]
        return [f"--fabric-ca-bundle={self.ca_bundle}"]

    def ssl_context(self) -> ssl.SSLContext | None:
        return None if self.insecure else ssl.create_default_context(cafile=str(self.ca_bundle))

    def start(self, attach_latency: float = 0.2) -> FabricService:
        self.port_file.unlink(missing_ok=True)
        tls = (
            ["--fabric-insecure=true"] if self.insecure
            else [f"--fabric-tls-cert={self.cert.cert}", f"--fabric-tls-key={self.cert.key}"]
        )  # fmt: skip
        self._spawn(
            [
                sys.executable, "-m", "fabric.service.main",
                f"--fabric-topology={self.topology}", f"--fabric-db={self.db}",
                f"--fabric-port={self.port}", f"--port-file={self.port_file}",
                f"--fabric-token-file={self.token_file}", f"--attach-latency={attach_latency}",
                "--detach-latency=0.1", *tls,
            ]
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            if not self.alive or time.monotonic() > deadline:
                raise RuntimeError(f"fabric did not start:\n{self.log_tail()}")
            time.sleep(0.05)
        scheme = "http" if self.insecure else "https"
        self.port = int(self.port_file.read_text().strip())
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        return self

    def request(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10, context=self.ssl_context()) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def faults(self, **body: Any) -> Any:
        return self.request("POST", "/patchbay/v1/faults", body)

    def attach_requests(self) -> list[dict[str, Any]]:
        """Every attach request the fabric received (the test-only audit):
        ``{"target", "initiator": "<node>/<adapter>", "dialect", "at"}`` each."""
        return list(self.request("GET", "/patchbay/v1/audit")["attachRequests"])

    def connections(self) -> dict[str, tuple[str, str, str]]:
        """Fabric device id -> (node, adapter, state) of every connection."""
        from driver.fabricclient.client import FabricClient

        async def read() -> dict[str, tuple[str, str, str]]:
            async with FabricClient(self.url, self.token, tls=self.ssl_context()) as fc:
                return {c.device: (c.node, c.adapter, c.state) for c in await fc.connections()}

        return asyncio.run(read())


class ControllerProcess(_Proc):
    """A ``patchbay-controller`` process."""

    def __init__(
        self, kubeconfig: Path, fabric: FabricService, log_path: Path, *extra: str
    ) -> None:
        super().__init__("controller", log_path)
        self.kubeconfig = kubeconfig
        self.fabric = fabric
        self.extra = extra

    def start(self, identity: str = "controller-0") -> ControllerProcess:
        self._spawn(
            [
                sys.executable, "-m", "driver.controller.process.main",
                f"--kubeconfig={self.kubeconfig}", f"--fabric-url={self.fabric.url}",
                f"--fabric-token-file={self.fabric.token_file}", *self.fabric.tls_args(),
                "--lease-namespace=default",
                f"--identity={identity}", "--fabric-refresh=300", "--log-level=debug",
                *self.extra,
            ]
        )  # fmt: skip
        return self
