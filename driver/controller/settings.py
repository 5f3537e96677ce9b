"""Settings of the controller process (``patchbay-controller``).

Each field is one setting: flag ``--<field-with-dashes>``, env var
``<FIELD_UPPER>``, Helm value ``controller.<fieldCamel>``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ControllerSettings(BaseModel):
    """patchbay controller: publishes the fabric pool and attaches allocated fabric devices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = Field(default=None, description="kubeconfig file; in-cluster if unset")
    fabric_url: str = Field(description="base URL of the fabric manager (Redfish service)")
    fabric_token: str = Field(default="", description="bearer token for the fabric manager")
    fabric_token_file: Path | None = Field(
        default=None, description="file holding the fabric bearer token (wins over --fabric-token)"
    )
    fabric_pool: str = Field(default="fabric", description="name of the published fabric pool")
    fabric_refresh: float = Field(
        default=5.0, gt=0, description="seconds between fabric inventory reads (no fabric watch)"
    )
    attach_timeout: float = Field(
        default=120.0, gt=0, description="seconds for an attach task and the node to see the device"
    )
    failed_device_hold: float = Field(
        default=600.0,
        ge=0,
        description="seconds a device whose attach failed stays out of the pool",
    )
    lease_namespace: str = Field(default="kube-system", description="namespace of the leader Lease")
    lease_name: str = Field(default="patchbay-controller", description="name of the leader Lease")
    lease_duration: float = Field(default=15.0, gt=0, description="leader lease duration, seconds")
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="this replica's identity in the Lease (default host-pid)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level name"
    )
    log_format: Literal["text", "json"] = Field(default="text", description="log output format")

    @model_validator(mode="after")
    def _has_token(self) -> ControllerSettings:
        if not self.fabric_token and self.fabric_token_file is None:
            raise ValueError("set fabric_token or fabric_token_file")
        return self

    def token(self) -> str:
        if self.fabric_token_file is not None:
            return self.fabric_token_file.read_text().strip()
        return self.fabric_token
