"""Simulated hosts: a sysfs tree, the NVML mock's state and a hot-plug feed
per node, built from a topology (see ``host.SimHost``)."""

from driver.pci.uevents import Uevent, UeventFeed
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import (
    CxlMemory,
    Gpu,
    Nic,
    Nvme,
    RootComplex,
    RootPort,
    Switch,
    Topology,
)

__all__ = [
    "TOPOLOGIES",
    "CxlMemory",
    "Gpu",
    "Nic",
    "Nvme",
    "RootComplex",
    "RootPort",
    "SimHost",
    "Switch",
    "Topology",
    "Uevent",
    "UeventFeed",
]
