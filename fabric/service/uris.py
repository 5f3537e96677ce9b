"""Every URI the simulated fabric serves, in one place.

Why: the resource shapes (``redfish.py``, ``hardware.py``), the routes
(``app.py``) and the behaviour (``core.py``, events) all name the same
resources; each URI is spelled here once. The layout follows the wire
contract of issue 22 and the DMTF mockups: fabric resources under
``/redfish/v1/Fabrics/<fabric>``, each node a ComputerSystem with its fabric
adapters, each switch enclosure a Chassis holding the pooled devices
(Processors, NetworkAdapters, Drives, PCIeDevices, MemoryDomains).
"""

from __future__ import annotations

from typing import Any

ROOT = "/redfish/v1"
FABRICS = f"{ROOT}/Fabrics"
SYSTEMS = f"{ROOT}/Systems"
CHASSIS = f"{ROOT}/Chassis"
TASK_SERVICE = f"{ROOT}/TaskService"
TASKS = f"{TASK_SERVICE}/Tasks"
MONITORS = f"{TASK_SERVICE}/TaskMonitors"
SESSION_SERVICE = f"{ROOT}/SessionService"
SESSIONS = f"{SESSION_SERVICE}/Sessions"
EVENT_SERVICE = f"{ROOT}/EventService"
ACCOUNT_SERVICE = f"{ROOT}/AccountService"
SSE = f"{EVENT_SERVICE}/SSE"
# Outside /redfish: test and admin endpoints no Redfish client or validator crawls.
FAULTS = "/patchbay/v1/faults"
AUDIT = "/patchbay/v1/audit"

Json = dict[str, Any]


def link(uri: str) -> Json:
    return {"@odata.id": uri}


def fabric_uri(fabric: str) -> str:
    return f"{FABRICS}/{fabric}"


def switch_uri(fabric: str, switch: str) -> str:
    return f"{fabric_uri(fabric)}/Switches/{switch}"


def port_uri(fabric: str, switch: str, port: str) -> str:
    return f"{switch_uri(fabric, switch)}/Ports/{port}"


def endpoint_uri(fabric: str, endpoint: str) -> str:
    return f"{fabric_uri(fabric)}/Endpoints/{endpoint}"


def connection_uri(fabric: str, connection: int) -> str:
    return f"{fabric_uri(fabric)}/Connections/{connection}"


def zone_uri(fabric: str, zone: str) -> str:
    return f"{fabric_uri(fabric)}/Zones/{zone}"


def task_uri(task: int) -> str:
    return f"{TASKS}/{task}"


def monitor_uri(task: int) -> str:
    return f"{MONITORS}/{task}"


def session_uri(session: str) -> str:
    return f"{SESSIONS}/{session}"


# ---- hosts: one ComputerSystem per node, its fabric adapters ---------------------------


def system_uri(node: str) -> str:
    return f"{SYSTEMS}/{node}"


def adapter_uri(node: str, adapter: str) -> str:
    return f"{system_uri(node)}/FabricAdapters/{adapter}"


def adapter_port_uri(node: str, adapter: str) -> str:
    return f"{adapter_uri(node, adapter)}/Ports/0"


# ---- the pooled devices: one Chassis per switch enclosure ------------------------------


def chassis_id(fabric: str, switch: str) -> str:
    return f"{fabric}-{switch}"


def chassis_uri(chassis: str) -> str:
    return f"{CHASSIS}/{chassis}"


def processor_uri(chassis: str, device: str) -> str:
    return f"{chassis_uri(chassis)}/Processors/{device}"


def network_adapter_uri(chassis: str, device: str) -> str:
    return f"{chassis_uri(chassis)}/NetworkAdapters/{device}"


def network_function_uri(chassis: str, device: str) -> str:
    return f"{network_adapter_uri(chassis, device)}/NetworkDeviceFunctions/0"


def pcie_device_uri(chassis: str, device: str) -> str:
    return f"{chassis_uri(chassis)}/PCIeDevices/{device}"


def pcie_function_uri(chassis: str, device: str) -> str:
    return f"{pcie_device_uri(chassis, device)}/PCIeFunctions/0"


def drive_uri(chassis: str, device: str) -> str:
    return f"{chassis_uri(chassis)}/Drives/{device}"


def cxl_device_uri(chassis: str, device: str, ld: int = 0) -> str:
    """LD ``ld`` of the CXL device ``device`` (the PCIeDevice's id)."""
    return f"{pcie_device_uri(chassis, device)}/CXLLogicalDevices/{ld}"


def memory_domain_uri(chassis: str, device: str) -> str:
    return f"{chassis_uri(chassis)}/MemoryDomains/{device}"


def memory_chunk_uri(chassis: str, device: str) -> str:
    return f"{memory_domain_uri(chassis, device)}/MemoryChunks/0"
