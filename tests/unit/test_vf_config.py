"""VfConfig decoding and precedence, and the plugin's PF selection file."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.claims.allocation import Allocation, OpaqueConfig
from driver.config import opaque
from driver.errors import ConfigError
from driver.settingsflags import parse_settings
from driver.vf.config import PfPoolConfig, VfConfig, load_pool_config
from plugin.settings import PluginSettings


def vf(mode: str, **extra: object) -> dict[str, object]:
    return {"apiVersion": opaque.API_VERSION, "kind": "VfConfig", "mode": mode, **extra}


def test_default_mode_is_netdev() -> None:
    config = opaque.decode({"apiVersion": opaque.API_VERSION, "kind": "VfConfig"}, "config[0]")
    assert isinstance(config, VfConfig) and config.mode == "netdev"


def test_class_first_then_claim_later_wins() -> None:
    alloc = Allocation(
        devices=(),
        configs=(
            OpaqueConfig("FromClaim", ("nic",), vf("vfio-pci"), 0),
            OpaqueConfig("FromClass", (), vf("netdev"), 1),
            OpaqueConfig("FromClaim", ("gpu",), vf("netdev"), 2),
        ),
    )
    decoded = [opaque.decode(c.parameters, "x") for c in alloc.configs_for("nic")]
    winner = opaque.effective(decoded, "vf", "vf-0000-17-00-2")
    assert isinstance(winner, VfConfig) and winner.mode == "vfio-pci"


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (vf("sriov"), "field mode"),
        (vf("netdev", vlan=3), "field vlan"),
    ],
)
def test_malformed_vf_config_names_the_field(params: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        opaque.decode(params, "config[2] (FromClaim)")
    assert "config[2] (FromClaim): invalid VfConfig" in str(info.value)


def test_kind_must_fit_the_device_type() -> None:
    vf_cfg = opaque.decode(vf("netdev"), "c")
    gpu_cfg = opaque.decode({"apiVersion": opaque.API_VERSION, "kind": "GpuConfig"}, "c")
    with pytest.raises(ConfigError, match="VfConfig does not apply to device gpu-0 of type gpu"):
        opaque.effective([vf_cfg], "gpu", "gpu-0")
    with pytest.raises(ConfigError, match="GpuConfig does not apply to device vf-1 of type vf"):
        opaque.effective([gpu_cfg], "vf", "vf-1")


def test_pool_config_from_yaml_and_json(tmp_path: Path) -> None:
    yml = tmp_path / "vf.yaml"
    yml.write_text("pfs:\n  - name: ens0f0np0\n    numVfs: 4\n  - vendorID: '0x15B3'\n")
    config = load_pool_config(yml)
    assert config.select("ens0f0np0", "0000:17:00.0", "15b3", "101d") is config.pfs[0]
    assert config.select("ens9", "0000:99:00.0", "15b3", "101d") is config.pfs[1]
    assert config.select("ens9", "0000:99:00.0", "8086", "1592") is None
    js = tmp_path / "vf.json"
    js.write_text('{"pfs": [{"pciAddress": "0000:17:00.0"}]}')
    assert load_pool_config(js).pfs[0].pci_address == "0000:17:00.0"
    assert load_pool_config(None) == PfPoolConfig()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("pfs:\n  - numVfs: 4\n", "at least one of name"),
        ("pfs:\n  - name: a\n    numvfs: 4\n", "field pfs.0.numvfs"),
        ("pfs:\n  - name: a\n    numVfs: -1\n", "field pfs.0.numVfs"),
        ("pfs:\n  - vendorID: mellanox\n", "field pfs.0.vendorID"),
    ],
)
def test_bad_pool_config_names_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "vf.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_pool_config(path)


def test_missing_pool_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_pool_config(tmp_path / "nope.yaml")


def test_vf_config_setting_has_one_name(tmp_path: Path) -> None:
    flag = parse_settings(PluginSettings, ["--node-name=n", f"--vf-config={tmp_path}/a.yaml"], {})
    assert flag.vf_config == tmp_path / "a.yaml"
    env = parse_settings(PluginSettings, ["--node-name=n"], {"VF_CONFIG": "/etc/vf.yaml"})
    assert env.vf_config == Path("/etc/vf.yaml")
    assert parse_settings(PluginSettings, ["--node-name=n"], {}).vf_config is None
