"""Ready-made host topologies used across tests and the demo.

Layouts follow common server boards: GPUs and NICs behind a PCIe switch
under one root port, so a GPU and a NIC share a root complex only where the
board wires them that way (see ARCHITECTURE.md section 6, pairing); on
``gpu-nvme`` a GPU and an NVMe drive share a switch (GPUDirect Storage).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fabric.simhost.topology import Gpu, Nic, Nvme, RootComplex, RootPort, Switch, Topology


def _bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn:x}"


def two_roots_h100_nic() -> Topology:
    """2 root complexes, each: a switch with 2 H100 + 1 NIC PF (8 VFs)."""
    roots = []
    for i, (bus, numa) in enumerate(((0x15, 0), (0x85, 1))):
        switch = Switch(
            _bdf(bus + 1),
            (
                Gpu(_bdf(bus + 3), "H100-SXM5-80GB"),
                Gpu(_bdf(bus + 4), "H100-SXM5-80GB"),
                Nic(_bdf(bus + 5), f"ens{i}f0np0", total_vfs=8, num_vfs=8),
            ),
        )
        roots.append(RootComplex(0, bus, numa, (RootPort(_bdf(bus, 1), switch),)))
    return Topology("2x-h100-nic", tuple(roots))


def numa_shared_nic() -> Topology:
    """NUMA node 0 with 2 roots: one has 2 H100 + a NIC PF (4 VFs), one 2 H100 only."""
    with_nic = Switch(
        _bdf(0x16),
        (
            Gpu(_bdf(0x18), "H100-SXM5-80GB"),
            Gpu(_bdf(0x19), "H100-SXM5-80GB"),
            Nic(_bdf(0x1A), "ens0f0np0", total_vfs=4, num_vfs=4),
        ),
    )
    gpus_only = Switch(
        _bdf(0x46), (Gpu(_bdf(0x48), "H100-SXM5-80GB"), Gpu(_bdf(0x49), "H100-SXM5-80GB"))
    )
    return Topology(
        "numa-shared-nic",
        (
            RootComplex(0, 0x15, 0, (RootPort(_bdf(0x15, 1), with_nic),)),
            RootComplex(0, 0x45, 0, (RootPort(_bdf(0x45, 1), gpus_only),)),
        ),
    )


def eight_a100_four_roots() -> Topology:
    """8 x A100-SXM4-80GB, two per root complex behind a switch; 2 NUMA nodes."""
    roots = []
    for i, bus in enumerate((0x07, 0x47, 0x87, 0xB7)):
        switch = Switch(
            _bdf(bus + 1),
            (Gpu(_bdf(bus + 3), "A100-SXM4-80GB"), Gpu(_bdf(bus + 4), "A100-SXM4-80GB")),
        )
        roots.append(RootComplex(0, bus, i // 2, (RootPort(_bdf(bus, 1), switch),)))
    return Topology("8x-a100", tuple(roots))


def gpuless_fabric() -> Topology:
    """No GPUs: a NIC PF (4 VFs) and two fabric adapters on two root complexes."""
    return Topology(
        "fabric-adapters",
        (
            RootComplex(
                0,
                0x15,
                0,
                (
                    RootPort(_bdf(0x15, 1), Nic(_bdf(0x16), "ens0f0np0", total_vfs=4, num_vfs=4)),
                    RootPort(_bdf(0x15, 2), None, adapter="adapter0"),
                ),
            ),
            RootComplex(0, 0x85, 1, (RootPort(_bdf(0x85, 1), None, adapter="adapter1"),)),
        ),
    )


def local_gpu_fabric() -> Topology:
    """``fabric-adapters`` with one local H100 on the second root complex: a
    GPU the fabric attaches behind adapter0 sits on a lower bus than it, so
    NVML numbers that one first (issue 38: the local GPU keeps its name)."""
    adapters = gpuless_fabric()
    first, second = adapters.roots
    ports = (*second.ports, RootPort(_bdf(0x85, 2), Gpu(_bdf(0x86))))
    return Topology("local-gpu-fabric", (first, dataclasses.replace(second, ports=ports)))


def four_h100_one_per_root() -> Topology:
    """4 x H100, one per root complex."""
    return Topology(
        "4x-h100",
        tuple(
            RootComplex(0, bus, i // 2, (RootPort(_bdf(bus, 1), Gpu(_bdf(bus + 1))),))
            for i, bus in enumerate((0x15, 0x45, 0x85, 0xC5))
        ),
    )


def two_gpus() -> Topology:
    """2 x H100 on one root complex."""
    return Topology(
        "2-gpus",
        (
            RootComplex(
                0,
                0x3A,
                0,
                (
                    RootPort(_bdf(0x3A, 1), Gpu(_bdf(0x3B))),
                    RootPort(_bdf(0x3A, 2), Gpu(_bdf(0x3C))),
                ),
            ),
        ),
    )


def gpus_nvme_fabric() -> Topology:
    """GPUDirect Storage board: 2 roots, each a switch with 2 H100 + 1 NVMe drive,
    and a fabric adapter on each root (fabric drives and CXL memory arrive there)."""
    roots = []
    for i, (bus, numa) in enumerate(((0x15, 0), (0x85, 1))):
        switch = Switch(
            _bdf(bus + 1),
            (
                Gpu(_bdf(bus + 3), "H100-SXM5-80GB"),
                Gpu(_bdf(bus + 4), "H100-SXM5-80GB"),
                Nvme(_bdf(bus + 5), serial=f"S6CKNT0W70{i:04d}"),
            ),
        )
        ports = (RootPort(_bdf(bus, 1), switch), RootPort(_bdf(bus, 2), None, f"adapter{i}"))
        roots.append(RootComplex(0, bus, numa, ports))
    return Topology("gpu-nvme", tuple(roots))


TOPOLOGIES: dict[str, Callable[[], Topology]] = {
    "2x-h100-nic": two_roots_h100_nic,
    "numa-shared-nic": numa_shared_nic,
    "8x-a100": eight_a100_four_roots,
    "fabric-adapters": gpuless_fabric,
    "local-gpu-fabric": local_gpu_fabric,
    "4x-h100": four_h100_one_per_root,
    "2-gpus": two_gpus,
    "gpu-nvme": gpus_nvme_fabric,
}
