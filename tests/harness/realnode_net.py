"""Namespaces and links of the real-node tier: a kind node without Docker.

Why this module exists: a real node (kubelet + containerd + kube-proxy, see
tests/harness/realnode.py) must not share the machine's network or its standard
paths with other nodes or with the machine itself. Like a kind node in its
container, each node gets

- a network namespace joined to a bridge that this launcher creates on the
  host (the bridge carries the control plane's address; nothing is ever added
  to the machine's own interfaces), and
- a mount namespace in which the node's private directories are bind-mounted
  over `/var/lib`, `/run` and `/var/log`, so the hard-coded paths
  (`/var/lib/kubelet/device-plugins/kubelet.sock`, `/run/containerd/s/...`,
  `/var/log/pods`, `/var/run/cdi`) and the chart's hostPaths mean the same
  on every node while each node has its own.

A *holder* process (``sleep``) owns both namespaces; every component is
started into them with ``nsenter``. Everything here is undone by
:func:`teardown_node` / :func:`delete_bridge`: killing the holder and the
processes inside its namespaces destroys the namespaces with their veth,
mounts and iptables rules. The host-wide sysctls that the kubelet rewrites
at each start are restored by :class:`SysctlGuard`.
Concurrency: plain blocking calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Host-wide tunables the kubelet sets at every start (pkg/kubelet/cm
# setupKernelTunables); the launcher puts back what was there.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Over these the node sees its own directories (see the module docstring).
PRIVATE_MOUNTS = ("/var/lib", "/run", "/var/log")


class NetError(RuntimeError):
    """A namespace, link or mount could not be set up; the message says which."""


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@dataclass(frozen=True)
class Network:
    """The node network of one run: a /24 on a bridge, one address per node.

    ``.1`` is the host end (the apiserver listens there), nodes get ``.10``
    and up; node ``i`` gives its pods ``<pod_prefix>.<i>.0/24``.
    """

    index: int = 0

    @property
    def bridge(self) -> str:
        return f"pbrn{self.index}"

    @property
    def prefix(self) -> str:
        return f"10.213.{self.index}"

    @property
    def host_ip(self) -> str:
        return f"{self.prefix}.1"

    def node_ip(self, i: int) -> str:
        return f"{self.prefix}.{10 + i}"

    def pod_cidr(self, i: int) -> str:
        return f"10.{214 + self.index}.{i}.0/24"

    @property
    def cluster_cidr(self) -> str:
        return f"10.{214 + self.index}.0.0/16"


def create_bridge(net: Network) -> None:
    """The host end of the node network (idempotent)."""
    if Path(f"/sys/class/net/{net.bridge}").exists():
        return
    _run("ip", "link", "add", net.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{net.host_ip}/24", "dev", net.bridge)
    _run("ip", "link", "set", net.bridge, "up")
    log.info("bridge %s up with %s/24", net.bridge, net.host_ip)


def delete_bridge(net: Network) -> None:
    if Path(f"/sys/class/net/{net.bridge}").exists():
        _run("ip", "link", "del", net.bridge)


def start_holder(
    node_dir: Path, log_path: Path, extra_binds: tuple[tuple[Path, str], ...] = ()
) -> int:
    """A process owning a new network and mount namespace with the private mounts
    (then ``extra_binds``: host directory -> path inside, made after them).

    Returns its pid; its namespaces live as long as it does.
    """
    binds = []
    for target in PRIVATE_MOUNTS:
        src = node_dir / "root" / target.strip("/").replace("/", "-")
        src.mkdir(parents=True, exist_ok=True)
        binds.append(f"mount --bind {src} {target}")
    for src, target in extra_binds:
        src.mkdir(parents=True, exist_ok=True)
        binds += [f"mkdir -p {target}", f"mount --bind {src} {target}"]
    # /var/run is a link to /run on Debian, so /var/run/cdi is private too.
    script = " && ".join([*binds, "exec sleep infinity"])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "slave", "--fork", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    # unshare --fork: the holder is unshare's child; wait for it to exec sleep.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for child in _children(proc.pid):
            if Path(f"/proc/{child}/comm").read_text().strip() == "sleep":
                return child
        if proc.poll() is not None:
            raise NetError(f"namespace holder for {node_dir.name} exited; see {log_path}")
        time.sleep(0.05)
    raise NetError(f"namespace holder for {node_dir.name} did not start; see {log_path}")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def nsenter(holder: int) -> list[str]:
    """The argv prefix that runs a command inside the holder's namespaces."""
    return ["nsenter", f"--target={holder}", "--net", "--mount", "--"]


def link_node(net: Network, holder: int, i: int) -> str:
    """A veth pair from the bridge into the node; the node's address."""
    host_end, node_end = f"{net.bridge}n{i}", f"{net.bridge}p{i}"
    if Path(f"/sys/class/net/{host_end}").exists():
        _run("ip", "link", "del", host_end)
    _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
    _run("ip", "link", "set", node_end, "netns", str(holder))
    _run("ip", "link", "set", host_end, "master", net.bridge, "up")
    ip = net.node_ip(i)
    inside = nsenter(holder)
    for argv in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "set", node_end, "name", "eth0"],
        ["ip", "addr", "add", f"{ip}/24", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "route", "add", "default", "via", net.host_ip],
    ):
        _run(*inside, *argv)
    return ip


def route_pods(net: Network, holder: int, others: list[int]) -> None:
    """Routes from one node to the pod subnets of the ``others`` (node indices).

    The nodes share the bridge's L2 segment, so each reaches another node's
    pods through that node's address (as kind's kindnet does); the host
    forwards nothing and its ``ip_forward`` stays as it was.
    """
    for j in others:
        _run(*nsenter(holder), "ip", "route", "replace", net.pod_cidr(j), "via", net.node_ip(j))


def _same_ns(pid: int, kind: str, ref: str) -> bool:
    with contextlib.suppress(OSError):
        return str(Path(f"/proc/{pid}/ns/{kind}").readlink()) == ref
    return False


def processes_of(holder: int, cgroup_root: str) -> list[int]:
    """Every process in the holder's mount namespace or below the node's cgroup."""
    try:
        ref = str(Path(f"/proc/{holder}/ns/mnt").readlink())
    except OSError:
        ref = ""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        if ref and _same_ns(pid, "mnt", ref):
            found.append(pid)
            continue
        with contextlib.suppress(OSError):
            if f":{cgroup_root}/" in (entry / "cgroup").read_text():
                found.append(pid)
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        for p in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p, os.WNOHANG)
        time.sleep(0.05)


class SysctlGuard:
    """Remembers the kubelet's host-wide sysctls and puts them back."""

    def __init__(self) -> None:
        self.saved: dict[str, str] = {}
        for key in KUBELET_SYSCTLS:
            with contextlib.suppress(OSError):
                self.saved[key] = Path(f"/proc/sys/{key}").read_text().strip()

    def changed(self) -> list[str]:
        out = []
        for key, value in self.saved.items():
            with contextlib.suppress(OSError):
                if Path(f"/proc/sys/{key}").read_text().strip() != value:
                    out.append(key)
        return out

    def restore(self) -> list[str]:
        """Write back what differs; the keys restored."""
        keys = self.changed()
        for key in keys:
            Path(f"/proc/sys/{key}").write_text(self.saved[key] + "\n")
            log.info("restored sysctl %s=%s", key.replace("/", "."), self.saved[key])
        return keys
