"""Where a container's fabric devices sit on its node's host: their PCIe roots.

Why a module: the pairing e2e tests (tests/e2e/test_fabric_domain_e2e.py)
check a pairing's constraint where it matters, in what the container was
given: each device the container's env names is found on the simulated
host (the GPU by its UUID in the NVML state, an NVMe drive by its
controller's PCI address, CXL memory by its memdev's serial) and its root
complex read from the host's sysfs tree, as the plugin reads a local
device's; :func:`paired` runs an example's claim and checks its allocation
and attach requests. Shared by the pairing cases, so each says only what it pairs.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from driver.fabric_devices.naming import adapter_device_name
from driver.pci.sysfs import pcie_root
from tests.e2e.fabric_helpers import Env, attr, fabric_pool, running
from tests.e2e.pods import claim_of, pod
from tests.e2e.tenants import container_record
from tests.harness.simnode import SimNode

EXAMPLES = Path(__file__).parents[2] / "deviceclasses/examples"


def root_of(sysfs_root: Path, path: Path) -> str:
    """The root complex (``pciDDDD:BB``) a sysfs device path sits under."""
    devices = Path(os.path.realpath(sysfs_root / "devices"))
    (root, *_) = Path(os.path.realpath(path)).relative_to(devices).parts
    assert root.startswith("pci"), f"{path} is not below a PCI root complex"
    return root


def gpu_root(sim: SimNode, uuid: str) -> str:
    """The root of the GPU the container sees as ``uuid`` (NVML's bus ID on the host)."""
    (bus_id,) = [g["pci_bus_id"] for g in sim.host.nvml.read()["gpus"] if g["uuid"] == uuid]
    return pcie_root(sim.host.sysfs_root, bus_id[-12:])  # NVML's 8-digit domain: the BDF's 4


def nvme_root(sim: SimNode, block: str) -> str:
    """The root of the NVMe controller of namespace ``block`` (``/dev/nvmeXn1``)."""
    ctrl = Path(block).name.rsplit("n", 1)[0]  # nvmeX
    address = (sim.host.sysfs_root / "class/nvme" / ctrl / "address").read_text().strip()
    return pcie_root(sim.host.sysfs_root, address)


def same_serial(a: str, b: str) -> bool:
    """Serials as sysfs writes them (hex) and as a node reports them, alike."""
    try:
        return int(a, 0) == int(b, 0)
    except ValueError:
        return a.strip().lower() == b.strip().lower()


def cxl_root(sim: SimNode, serial: str) -> str:
    """The root of the CXL memory device whose memdev has ``serial``."""
    bus = sim.host.sysfs_root / "bus/cxl/devices"
    (mem,) = [
        m for m in bus.glob("mem*") if same_serial((m / "serial").read_text().strip(), serial)
    ]
    return root_of(sim.host.sysfs_root, Path(os.path.realpath(mem)).parent)  # its PCI function


def attach_requests(env: Env) -> Counter[tuple[str, str]]:
    """(device, "node/adapter") -> attach requests the fabric received."""
    return Counter((r["target"], r["initiator"]) for r in env.fabric.attach_requests())


def paired(env: Env, resource_api: Any, core: Any, ns: str, example: str, name: str,
           kind: str) -> tuple[SimNode, dict[str, str]]:  # fmt: skip
    """The example's claim (its own template) for a pod the scheduler places:
    the fabric GPU and the ``kind`` device of sw1 (the first node's alone)
    allocated beside that node's adapter1 and attached through it, one attach
    request each; the node and the container's env."""
    (tmpl,) = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text())
               if d and d["kind"] == "ResourceClaimTemplate"]  # fmt: skip
    resource_api.create_namespaced_resource_claim_template(ns, tmpl)
    before = attach_requests(env)
    pod(core, ns, name, None, tmpl["metadata"]["name"])
    running(env, core, ns, name, timeout=150)
    sim = env.nodes[0]  # the one node whose adapter reaches sw1's NVMe and CXL memory
    assert core.read_namespaced_pod(name, ns).spec.node_name == sim.name
    claim = claim_of(core, resource_api, ns, name)
    got = {r.request: (r.pool, r.device) for r in claim.status.allocation.devices.results}
    assert got.pop("adapter") == (f"fabric/adapters/{sim.name}", adapter_device_name("adapter1"))
    assert {p for p, _ in got.values()} == {"fabric/cxl0.sw1"}
    pool = fabric_pool(resource_api)
    assert sorted(attr(pool[d], "fabricDevice") for _, d in got.values()) == sorted(["gpu-2", kind])
    through = f"{sim.name}/adapter1"
    assert attach_requests(env) - before == Counter({("gpu-2", through): 1, (kind, through): 1})
    return sim, dict(e.split("=", 1) for e in container_record(sim, ns, name)["env"])
