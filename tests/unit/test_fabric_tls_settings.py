"""Plain HTTP to or from the fabric only with the explicit insecure setting,
one name (``--fabric-insecure`` / ``FABRIC_INSECURE``) on both ends; the
service needs its certificate and key together."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.controller.process.settings import ControllerSettings
from driver.errors import ConfigError
from driver.settingsflags import parse_settings
from fabric.service.settings import FabricSettings


def test_the_controller_refuses_a_plain_http_fabric_unless_told() -> None:
    with pytest.raises(ConfigError, match="plain HTTP: set --fabric-insecure / FABRIC_INSECURE"):
        parse_settings(ControllerSettings, ["--fabric-url=http://f:7080", "--fabric-token=t"], {})
    told = parse_settings(
        ControllerSettings, ["--fabric-url=http://f:7080", "--fabric-token=t"],
        {"FABRIC_INSECURE": "true"},
    )  # fmt: skip
    assert told.fabric_insecure
    tls = parse_settings(ControllerSettings, ["--fabric-url=https://f:7080", "--fabric-token=t"])
    assert not tls.fabric_insecure and tls.client_ssl().check_hostname
    with pytest.raises(ConfigError, match="want https://host:port"):
        parse_settings(ControllerSettings, ["--fabric-url=f:7080", "--fabric-token=t"], {})


def test_the_service_serves_plain_http_only_when_told(tmp_path: Path) -> None:
    base = [f"--fabric-topology={tmp_path / 't.yaml'}", "--fabric-token=t"]
    with pytest.raises(ConfigError, match="or set --fabric-insecure / FABRIC_INSECURE"):
        parse_settings(FabricSettings, base, {})
    with pytest.raises(ConfigError, match="both --fabric-tls-cert / FABRIC_TLS_CERT and"):
        parse_settings(FabricSettings, [*base, "--fabric-tls-cert=c"], {})
    plain = parse_settings(FabricSettings, [*base, "--fabric-insecure=true"], {})
    assert plain.server_ssl() is None
