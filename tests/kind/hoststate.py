"""What the kind tier checks on the host: settings, leftovers, the traffic guard.

Why this module exists: "nothing left, nothing leaked" is the kind path's
promise on a shared machine, and it is checked from the host's own view, not
from Docker's (the private daemon is stopped by then). HostState is a snapshot
of everything Docker, kind or the kubelets in the nodes could change: sysctls
that are not namespaced, the FORWARD policy, iptables chains, network links,
mounts and /lib/modules (which Docker creates for kind's bind mount).

The guard: a counting DROP rule for packets from the kind bridge to any
address outside kind's subnet and pod CIDR (guard_install says where).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUARD = "patchbay-kind-guard"
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
)


def kind_names() -> dict[str, str]:
    """KIND_BRIDGE, KIND_SUBNET, ... as hack/kind/common.sh names them (its one owner)."""
    script = "source hack/kind/common.sh; echo $KIND_BRIDGE $KIND_SUBNET $KIND_NET $KIND_POD_CIDR"
    out = subprocess.run(
        ["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return {"bridge": out[0], "subnet": out[1], "network": out[2], "pods": out[3]}


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@dataclass(frozen=True)
class HostState:
    """The host settings and objects the kind path may change."""

    sysctls: tuple[tuple[str, str], ...]
    forward_policy: str
    chains: frozenset[str]
    links: frozenset[str]
    mounts: frozenset[str]
    lib_modules: bool

    @classmethod
    def read(cls) -> HostState:
        values = tuple(
            (s, Path("/proc/sys", s).read_text().strip())
            for s in SYSCTLS
            if Path("/proc/sys", s).exists()
        )
        policy = re.search(r"^-P FORWARD (\S+)", _sh("iptables", "-S", "FORWARD"), re.M)
        chains = frozenset(
            f"{table}/{line.split()[1]}"
            for table in ("filter", "nat", "mangle", "raw")
            for line in _sh("iptables", "-t", table, "-S").splitlines()
            if line.startswith("-N ")
        )
        links = frozenset(
            line.split(": ")[1].split("@")[0] for line in _sh("ip", "-o", "link").splitlines()
        )
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
        mounts = frozenset(line.split()[4] for line in mountinfo)
        return cls(
            sysctls=values,
            forward_policy=policy.group(1) if policy else "",
            chains=chains,
            links=links,
            mounts=mounts,
            lib_modules=Path("/lib/modules").exists(),
        )


def guard_install() -> None:
    """Count (and drop) every packet from the kind bridge to a non-kind address.

    In mangle PREROUTING, which every packet from the bridge traverses (with
    ip_forward off, packets for elsewhere never reach FORWARD): kind's subnet
    and its pod CIDR (node-to-node pod traffic, bridged) return, the rest is
    counted by the chain's last rule.
    """
    names = kind_names()
    chain = ["iptables", "-t", "mangle"]
    subprocess.run([*chain, "-N", GUARD], check=True)
    for net in (names["subnet"], names["pods"]):
        subprocess.run([*chain, "-A", GUARD, "-d", net, "-j", "RETURN"], check=True)
    subprocess.run([*chain, "-A", GUARD, "-j", "DROP"], check=True)
    subprocess.run([*chain, "-I", "PREROUTING", "-i", names["bridge"], "-j", GUARD], check=True)


def guard_remove() -> None:
    names = kind_names()
    chain = ["iptables", "-t", "mangle"]
    subprocess.run([*chain, "-D", "PREROUTING", "-i", names["bridge"], "-j", GUARD], check=False)
    subprocess.run([*chain, "-F", GUARD], check=False)
    subprocess.run([*chain, "-X", GUARD], check=False)


def guard_count() -> int:
    """Packets from the kind bridge to anywhere else, so far."""
    out = _sh("iptables", "-t", "mangle", "-L", GUARD, "-v", "-x", "-n")
    (drop,) = [line for line in out.splitlines() if " DROP " in f" {line} "]
    return int(drop.split()[0])
