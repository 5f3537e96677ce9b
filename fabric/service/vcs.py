"""Adapter room as DMTF models it: a Virtual CXL Switch per host port, with its vPPBs.

Why a module: a host adapter can take only so many fabric devices, and a
real manager says how many where the Redfish schema puts it. In DMTF's
model (Switch v1_9+ ``CXL.VirtualCXLSwitches``, VirtualCXLSwitch v1_0_0,
VirtualPCI2PCIBridge v1_0_0; DMTF's public-cxl mockup shows one) each host
upstream port is bound to a Virtual CXL Switch (VCS) whose ``Links``
name the host's initiator endpoint and the upstream port; each device the
host takes is bound to one of the VCS's virtual PCI-to-PCI bridges
(vPPBs). So the number of vPPBs is the adapter's room; a vPPB is
``BoundPhysicalPort`` (its ``Links.Endpoints`` the device, ``Links.Port``
the device's downstream port) or ``Unbound``. PCIe switches with host
partitions (virtual switches) have the same limit and no schema of their
own for it: the simulator serves a VCS for an upstream port of either
fabric type when its topology gives ``vppbs``, and nothing (no limit) when
it does not. Pure functions from the inventory and the connections.
"""

from __future__ import annotations

from fabric.service import uris
from fabric.service.inventory import Initiator, Inventory
from fabric.service.store import Connection
from fabric.service.uris import Json, link


def vcs_initiators(inv: Inventory, fab: str, sw: str) -> list[Initiator]:
    """The switch's upstream ports that have a VCS, by port id."""
    ups = [i for i in inv.initiators.values() if (i.fabric, i.switch) == (fab, sw) and i.vppbs]
    return sorted(ups, key=lambda i: i.port)


def vcss_uri(fab: str, sw: str) -> str:
    return f"{uris.switch_uri(fab, sw)}/VCSs"


def vcs_uri(ini: Initiator) -> str:
    return f"{vcss_uri(ini.fabric, ini.switch)}/{ini.port}"


def switch_cxl(inv: Inventory, fab: str, sw: str) -> Json | None:
    """The switch's ``CXL`` property (None when no upstream port has a VCS)."""
    ups = vcs_initiators(inv, fab, sw)
    if not ups:
        return None
    return {
        "MaxVCSsSupported": len(ups),
        "TotalNumbervPPBs": sum(i.vppbs or 0 for i in ups),
        "VirtualCXLSwitches": link(vcss_uri(fab, sw)),
    }


def bound(ini: Initiator, conns: list[Connection]) -> list[Connection]:
    """The connections holding a vPPB of ``ini``'s VCS (every state: a device
    holds its bridge from its attach request until it is detached), in order."""
    return sorted((c for c in conns if c.initiator == ini.id), key=lambda c: c.id)


def vcs(ini: Initiator) -> Json:
    return {
        "@odata.id": vcs_uri(ini),
        "@odata.type": "#VirtualCXLSwitch.v1_0_0.VirtualCXLSwitch",
        "Id": ini.port,
        "Name": f"virtual switch of {ini.node} {ini.adapter}",
        "VCSId": ini.port,
        "Status": {"State": "Enabled", "Health": "OK"},
        "VPPBs": link(f"{vcs_uri(ini)}/VPPBs"),
        "Links": {
            "Endpoints": [link(uris.endpoint_uri(ini.fabric, ini.id))],
            "Port": link(uris.port_uri(ini.fabric, ini.switch, ini.port)),
        },
    }


def vppb_ids(ini: Initiator) -> list[str]:
    return [str(n) for n in range(1, (ini.vppbs or 0) + 1)]


def vppb(inv: Inventory, ini: Initiator, ident: str, conns: list[Connection]) -> Json:
    """vPPB ``ident`` (1-based): bound to the ``ident``-th device ``ini`` holds, or unbound."""
    held = bound(ini, conns)
    n = int(ident) - 1
    body: Json = {
        "@odata.id": f"{vcs_uri(ini)}/VPPBs/{ident}",
        "@odata.type": "#VirtualPCI2PCIBridge.v1_0_0.VirtualPCI2PCIBridge",
        "Id": ident,
        "Name": f"vPPB {ident}",
        "VPPBId": ident,
        "Status": {"State": "Enabled", "Health": "OK"},
        "BindingStatus": "Unbound",
    }
    if n < len(held):
        tgt = inv.targets[held[n].device]
        body["BindingStatus"] = "BoundPhysicalPort"
        body["Links"] = {
            "Endpoints": [link(uris.endpoint_uri(tgt.fabric, tgt.id))],
            "Port": link(uris.port_uri(tgt.fabric, tgt.switch, tgt.port)),
        }
    return body


def full(ini: Initiator, conns: list[Connection]) -> bool:
    """Whether every vPPB of ``ini``'s VCS is bound (never, without a VCS)."""
    return ini.vppbs is not None and len(bound(ini, conns)) >= ini.vppbs
