"""The manager's name for an attached GPU, for the claim's status data.

Why a module: a count-based fabric manager names what it attached only by
a board serial (``res_serial_num``), not by the GPU UUID the node sees. The
node's plugin reports each attached GPU's NVML serial next to its UUID
(``NodeFabric.serials``); the controller writes that serial into the claim's
device status ``data`` with the UUID, before ``FabricDeviceReady``, so the
claim says which device it got in both the manager's and the node's terms
(``kubectl get resourceclaim -o yaml``; docs/fabric.md, "Count-based
managers"). Any dialect gets it where the node reports a serial.
"""

from __future__ import annotations

from driver.fabric_devices.naming import NodeFabric

SERIAL_KEY = "serial"  # in the claim's device status data (as an NVMe drive's identity is)


def serial_data(report: NodeFabric | None, kind: str, identity: str) -> dict[str, str]:
    """``{"serial": <board serial>}`` of the attached GPU ``identity``, else nothing."""
    if report is None or kind != "gpu":
        return {}
    serial = next((s for s, uuid in sorted(report.serials.items()) if uuid == identity), "")
    return {SERIAL_KEY: serial} if serial else {}
