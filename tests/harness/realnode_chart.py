"""Install helm/patchbay on real nodes, as a user would (tests/harness/realnode.py).

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

from driver.fabric_devices.naming import REACH_LABEL_PREFIX
from tests.harness.fabricsim import switch
from tests.harness.realnode_node import make_path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "patchbay"
SIMULATED_VALUES = REPO / "hack" / "simulated-values.yaml"
RELEASE = RELEASE_NS = "patchbay"
SIM_HOSTS_DIR = Path("/var/lib/patchbay-sim-hosts")


class HelmError(RuntimeError):
    """helm refused or failed; the message holds its output."""


# The fabric's NVMe drive and CXL Type 3 memory (the simulator's defaults: a
# 3.84 TB PM1733, 256 GiB of memory), behind adapter0 with the GPUs that the
# examples gpu-nvme-gds.yaml (same pcieRoot) and gpu-cxl-memory.yaml (same
# adapter) pair them with.
NVME, CXL_MEMORY = "nvme-0", "cxl-0"


def fabric_values(node: str) -> dict[str, Any]:
    """The controller and the simulated fabric, a CXL fabric (CXL memory needs
    one; it carries PCIe devices too) wired to ``node``'s two adapters
    (``fabric-adapters`` topology): behind adapter0 five GPUs, an NVMe drive
    and CXL memory, behind adapter1 gpu-2. Five GPUs behind adapter0: `make
    demo` runs three workloads that need one there (a GPU + VF pair, the GPU
    + NVMe and GPU + CXL examples) beside two that take any fabric GPU."""
    host_dir = SIM_HOSTS_DIR / node
    up0, up1 = [(node, "adapter0", host_dir)], [(node, "adapter1", host_dir)]
    sw0 = switch("sw0", up0, ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-5"])
    for dev in ({"kind": "nvme", "id": NVME}, {"kind": "cxlmem", "id": CXL_MEMORY}):
        sw0["slots"].append({"port": f"slot{len(sw0['slots'])}", "device": dev})
    return {
        "controller": {"enabled": True},
        "fabric": {
            "enabled": True,
            "attachLatency": 1.0,
            "topology": {
                "fabrics": [
                    {"id": "cxl0", "type": "CXL", "switches": [sw0, switch("sw1", up1, ["gpu-2"])]}
                ]
            },
        },
    }


def reach_labels() -> dict[str, str]:
    """The reach labels of the node :func:`fabric_values` wires (docs/fabric.md,
    "Reach labels"): each switch's devices reach it through an adapter of
    their own, so each switch is a reach domain, ``<fabric>.<switch>``. Set
    where the node is made, as provisioning would (kubelet ``--node-labels``)."""
    fabrics = fabric_values("")["fabric"]["topology"]["fabrics"]
    domains = [f"{f['id']}.{sw['id']}" for f in fabrics for sw in f["switches"]]
    return {REACH_LABEL_PREFIX + d: "" for d in domains}


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
