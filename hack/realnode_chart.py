"""Install helm/patchbay on real nodes, as a user would (hack/realnode.py).

Why this module exists: the node test tier and ``make demo`` install the
chart the same way: ``helm install`` with the values every simulated-host
setup shares (``hack/simulated-values.yaml``, also hack/kind's) plus the
controller and the simulated fabric wired to the GPU-less node's adapters.
One place for the release name, the values and the helm invocation.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from fabricsim import switch
from realnode_node import make_path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "patchbay"
SIMULATED_VALUES = REPO / "hack" / "simulated-values.yaml"
RELEASE = RELEASE_NS = "patchbay"
SIM_HOSTS_DIR = Path("/var/lib/patchbay-sim-hosts")


class HelmError(RuntimeError):
    """helm refused or failed; the message holds its output."""


def fabric_values(node: str) -> dict[str, Any]:
    """The controller and the simulated fabric: gpu-0, gpu-1 behind ``node``'s
    adapter0 and gpu-2 behind its adapter1 (``fabric-adapters`` topology)."""
    host_dir = SIM_HOSTS_DIR / node
    up0, up1 = [(node, "adapter0", host_dir)], [(node, "adapter1", host_dir)]
    return {
        "controller": {"enabled": True},
        "fabric": {
            "enabled": True,
            "attachLatency": 1.0,
            "topology": {
                "fabrics": [
                    {
                        "id": "pcie0",
                        "type": "PCIe",
                        "switches": [
                            switch("sw0", up0, ["gpu-0", "gpu-1"]),
                            switch("sw1", up1, ["gpu-2"]),
                        ],
                    }
                ]
            },
        },
    }


class Release:
    """The patchbay release on one cluster: its values files and helm calls."""

    def __init__(self, kubeconfig: Path, work_dir: Path, fabric_node: str | None) -> None:
        self.kubeconfig = kubeconfig
        self.values = [SIMULATED_VALUES]
        if fabric_node:
            extra = work_dir / "fabric-values.yaml"
            work_dir.mkdir(parents=True, exist_ok=True)
            extra.write_text(yaml.safe_dump(fabric_values(fabric_node)))
            self.values.append(extra)

    def helm(self, *args: str) -> str:
        argv = [str(make_path("helm-path")), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise HelmError(f"helm {args[0]}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout

    def _values(self, sets: tuple[str, ...]) -> list[str]:
        args = [a for v in self.values for a in ("-f", str(v))]
        return args + [a for s in sets for a in ("--set", s)]

    def install(self, *sets: str, timeout: str = "5m") -> str:
        return self.helm("install", RELEASE, str(CHART), "--namespace", RELEASE_NS,
                         "--create-namespace", *self._values(sets), "--wait",
                         "--timeout", timeout)  # fmt: skip

    def upgrade(self, *sets: str, wait: bool = False) -> str:
        return self.helm("upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS,
                         *self._values(sets), *(("--wait",) if wait else ()))  # fmt: skip
