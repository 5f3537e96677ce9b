"""One name per setting: flag, env var and Helm value; flag beats env."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.logconfig import JsonFormatter
from driver.settingsflags import env_name, flag_name, helm_name, parse_settings
from plugin.settings import PluginSettings


def test_names_line_up() -> None:
    assert (flag_name("cdi_root"), env_name("cdi_root"), helm_name("cdi_root")) == (
        "--cdi-root",
        "CDI_ROOT",
        "cdiRoot",
    )


def test_flag_beats_env_beats_default() -> None:
    env = {"NODE_NAME": "from-env", "CDI_ROOT": "/env/cdi"}
    s = parse_settings(PluginSettings, ["--cdi-root=/flag/cdi"], env)
    assert s.node_name == "from-env"
    assert s.cdi_root == Path("/flag/cdi")
    assert s.registry_dir == Path("/var/lib/kubelet/plugins_registry")


def test_errors_name_flag_and_env() -> None:
    with pytest.raises(ConfigError, match="--node-name / NODE_NAME"):
        parse_settings(PluginSettings, [], {})
    with pytest.raises(ConfigError, match="--log-format / LOG_FORMAT"):
        parse_settings(PluginSettings, ["--node-name=n", "--log-format=xml"], {})


def test_json_log_lines() -> None:
    record = logging.LogRecord("driver.x", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "hello there" and line["level"] == "info" and line["logger"] == "driver.x"


def test_model_level_error_names_the_settings() -> None:
    # A check across settings has no location: its message still names them.
    from driver.controller.process.settings import ControllerSettings

    with pytest.raises(ConfigError) as info:
        parse_settings(ControllerSettings, ["--fabric-url=http://fabric"], {})
    text = str(info.value)
    assert "?" not in text
    assert "--fabric-token / FABRIC_TOKEN or --fabric-token-file / FABRIC_TOKEN_FILE" in text
