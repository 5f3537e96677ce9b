"""The fabric pool's name is one setting, read by the controller and the node
plugin alike (it used to be a controller setting and a constant in the plugin,
so changing it broke every fabric claim)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest

from driver.controller.process.settings import ControllerSettings
from driver.devices.handler import DeviceHandler
from driver.devices.kind import Discovery
from driver.devices.model import PCI_BUS_ID, Device
from driver.errors import ConfigError
from driver.fabric_devices.naming import FABRIC_POOL, variant_name
from driver.kube.api import KubeApi
from driver.settingsflags import parse_settings
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import Gpu
from plugin.app import NodePlugin
from plugin.settings import PluginSettings

UUID = "GPU-6f1f0c64-5a43-4c63-9d8e-8f3b3c1d2e11"
CONTROLLER_ENV = {"FABRIC_URL": "http://fabric", "FABRIC_TOKEN": "t", "FABRIC_INSECURE": "true"}


def test_one_name_one_default_for_both_processes() -> None:
    env = {"NODE_NAME": "node-a", **CONTROLLER_ENV}
    assert parse_settings(PluginSettings, [], env).fabric_pool == FABRIC_POOL
    assert parse_settings(ControllerSettings, [], env).fabric_pool == FABRIC_POOL
    env["FABRIC_POOL"] = "pool-b"
    assert parse_settings(PluginSettings, [], env).fabric_pool == "pool-b"
    assert parse_settings(ControllerSettings, [], env).fabric_pool == "pool-b"
    assert parse_settings(PluginSettings, ["--fabric-pool=pool-c"], env).fabric_pool == "pool-c"


def test_pool_name_must_be_a_dns_subdomain() -> None:
    with pytest.raises(ConfigError, match="--fabric-pool / FABRIC_POOL"):
        parse_settings(PluginSettings, ["--node-name=n", "--fabric-pool=Not_A_Pool"], {})


class _Found:
    """A device family that finds one given device."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def discover(self) -> Discovery:
        return Discovery((self.device,))

    def handlers(self) -> Mapping[str, DeviceHandler]:
        return {}


async def test_plugin_maps_attached_devices_into_the_configured_pool(tmp_path: Path) -> None:
    host = SimHost.build(TOPOLOGIES["fabric-adapters"](), tmp_path, "node-a")
    bdf = host.free_bdf("adapter1")
    host.hot_add("adapter1", Gpu(bdf, uuid=UUID))
    settings = PluginSettings(
        node_name="node-a",
        fabric_pool="pool-b",
        fabric_adapters="adapter0=0000:15:02.0,adapter1=0000:85:01.0",
        sysfs_root=host.sysfs_root,
    )
    gpu = Device("gpu-0", "gpu", UUID, {PCI_BUS_ID: bdf})
    plugin = NodePlugin(settings, cast(KubeApi, object()), [_Found(gpu)])
    await plugin.rescan()
    assert plugin.inventory.pools() == {"node-a", "pool-b"}
    variant = variant_name(UUID, "node-a", "adapter1")
    assert plugin.inventory.lookup("pool-b", variant) is not None


def test_the_pool_shape_is_one_setting_and_a_wrong_one_is_named() -> None:
    env = dict(CONTROLLER_ENV)
    assert parse_settings(ControllerSettings, [], env).fabric_pool_shape == "per-domain"
    env["FABRIC_POOL_SHAPE"] = "per-node"
    assert parse_settings(ControllerSettings, [], env).fabric_pool_shape == "per-node"
    flag = ["--fabric-pool-shape=per-domain"]
    assert parse_settings(ControllerSettings, flag, env).fabric_pool_shape == "per-domain"
    with pytest.raises(ConfigError, match="FABRIC_POOL_SHAPE"):
        parse_settings(ControllerSettings, [], {**env, "FABRIC_POOL_SHAPE": "domain"})
