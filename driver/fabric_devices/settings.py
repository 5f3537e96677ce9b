"""The fabric pool's name: one setting that both processes read.

The controller publishes the fabric pool under this name; the node plugin
prepares claims allocated from it (mapping each variant to the device the
fabric attached). Both must agree or every fabric claim fails, so the
setting is defined once, here, and both settings models inherit it: flag
``--fabric-pool``, env var ``FABRIC_POOL``, default :data:`FABRIC_POOL`. The
chart sets it for both from its one value ``controller.fabricPool``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from driver.fabric_devices.naming import FABRIC_POOL

# A pool name is a DNS subdomain, or several joined by "/" (resource.k8s.io).
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
POOL_NAME_PATTERN = rf"^{_SUBDOMAIN}(/{_SUBDOMAIN})*$"


class FabricPoolSettings(BaseModel):
    fabric_pool: str = Field(
        default=FABRIC_POOL,
        max_length=253,
        pattern=POOL_NAME_PATTERN,
        description="name of the fabric pool: the controller publishes it, the node plugin "
        "prepares its devices; set the same value for both",
    )
