"""Settings of the fabric service process (``patchbay-fabric``).

Each field is one setting: flag ``--<field-with-dashes>``, env var
``<FIELD_UPPER>``, Helm value ``fabric.<fieldCamel>`` (see
``driver.settingsflags``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field

from driver.fabricclient.tls import FabricTlsServerSettings
from driver.fabricclient.token import FabricTokenSettings
from driver.process import ProcessSettings


class FabricSettings(ProcessSettings, FabricTokenSettings, FabricTlsServerSettings):
    """patchbay simulated PCIe/CXL fabric: a Redfish-shaped composition service."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fabric_topology: Path = Field(description="YAML/JSON file: fabrics, switches, wiring, devices")
    fabric_db: Path = Field(default=Path("fabric.db"), description="SQLite database file (state)")
    listen_address: str = Field(default="127.0.0.1", description="address to serve the API on")
    fabric_port: int = Field(default=7080, ge=0, le=65535, description="TCP port; 0 picks one")
    port_file: Path | None = Field(
        default=None, description="write the bound port here once serving (tests, scripts)"
    )
    attach_latency: float = Field(default=0.5, ge=0, description="seconds an attach takes")
    detach_latency: float = Field(default=0.2, ge=0, description="seconds a detach takes")
