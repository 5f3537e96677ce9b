"""Settings of the controller process (``patchbay-controller``).

Each field is one setting: flag ``--<field-with-dashes>``, env var
``<FIELD_UPPER>``, Helm value ``controller.<fieldCamel>``.
"""

from __future__ import annotations

import os
import socket
from typing import Literal, Self

from pydantic import ConfigDict, Field, model_validator

from driver.controller.process.leader import LeaseTiming
from driver.controller.process.webhook import WebhookSettings
from driver.controller.spares.settings import SpareSettings
from driver.fabric_devices.settings import FabricPoolSettings
from driver.fabricclient.auth import FabricAuthSettings
from driver.fabricclient.dialect_count import FabricCountSettings
from driver.fabricclient.inventory import FabricSystemsSetting
from driver.fabricclient.limits import FabricLimitsSettings
from driver.fabricclient.tls import FabricTlsClientSettings, check_url
from driver.httpendpoint import MetricsPortSettings
from driver.process import ProcessSettings


class ControllerSettings(
    ProcessSettings,
    FabricAuthSettings,
    FabricCountSettings,
    FabricSystemsSetting,
    FabricLimitsSettings,
    FabricTlsClientSettings,
    FabricPoolSettings,
    MetricsPortSettings,
    WebhookSettings,
    SpareSettings,
):
    """patchbay controller: publishes the fabric pool and attaches allocated fabric devices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = Field(default=None, description="kubeconfig file; in-cluster if unset")
    fabric_url: str = Field(
        description="base URL of the fabric manager (Redfish service), https:// (http:// only "
        "with --fabric-insecure)"
    )
    fabric_refresh: float = Field(
        default=30.0,
        gt=0,
        description="seconds between fabric inventory reads besides those its events trigger",
    )
    attach_timeout: float = Field(
        default=120.0, gt=0, description="seconds for an attach task and the node to see the device"
    )
    fabric_unreachable_budget: float = Field(
        default=120.0,
        gt=0,
        description="seconds in a row the fabric may be unreachable (or answer garbage) during "
        "an attach before it fails (FabricDeviceFailed); that time is not attach_timeout's",
    )
    fabric_pool_shape: Literal["per-node", "per-domain"] = Field(
        default="per-domain",
        description="how the fabric pool is published: per-domain (each device once, in a pool "
        "per reach domain; nodes need their reach labels, docs/fabric.md) or per-node (a "
        "variant per device and node: the pool grows with the cluster, docs/scale.md)",
    )
    failed_device_hold: float = Field(
        default=600.0,
        ge=0,
        description="seconds a device whose attach was refused or failed stays out of the pool",
    )
    lease_namespace: str = Field(default="kube-system", description="namespace of the leader Lease")
    lease_name: str = Field(default="patchbay-controller", description="name of the leader Lease")
    lease_duration: float = Field(
        default=15.0,
        gt=0,
        description="leader lease duration, seconds (over 3.6: the holder renews every 2 s "
        "and steps down after two thirds of it)",
    )
    device_leases: bool = Field(
        default=False,
        description="run the device lease clock (docs/leases.md): stamp, warn, expire and evict "
        "by the DeviceLeasePolicies (the chart's leases.enabled installs their CRD)",
    )
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="this replica's identity in the Lease (default host-pid)",
    )

    @model_validator(mode="after")
    def _tls_unless_insecure(self) -> Self:
        check_url(self.fabric_url, self.fabric_insecure)
        return self

    @model_validator(mode="after")
    def _lease_timing(self) -> Self:
        self.lease_timing()  # a ValueError naming lease_duration
        return self

    def lease_timing(self) -> LeaseTiming:
        return LeaseTiming.of(self.lease_duration)
