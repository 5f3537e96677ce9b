"""Client of a Redfish-shaped composition service (our simulated fabric).

The controller uses :class:`FabricClient` to list fabric devices with the
host adapters that can reach them, attach a device to a node through an
adapter, poll the attach/detach task, detach, and read device health. It
lives in ``driver`` because the controller does, and ``driver`` never
imports ``fabric``: it speaks to the service only over HTTP.
"""

from driver.errors import FabricApiError, FabricConflict, FabricNotFound, FabricUnavailable
from driver.fabricclient.client import FabricClient
from driver.fabricclient.model import (
    AttachResult,
    FabricConnection,
    FabricDevice,
    FabricInventory,
    FabricTask,
    HostAdapter,
)

__all__ = [
    "AttachResult",
    "FabricApiError",
    "FabricClient",
    "FabricConflict",
    "FabricConnection",
    "FabricDevice",
    "FabricInventory",
    "FabricNotFound",
    "FabricTask",
    "FabricUnavailable",
    "HostAdapter",
]
