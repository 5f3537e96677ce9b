"""The Helm chart stays in step with its sources without running helm.

Why: deviceclasses/ is the single source of the DeviceClasses (the chart holds
copies because a chart cannot read outside its directory), and every process
setting must have its one Helm value (flag --cdi-root == kubeletPlugin.cdiRoot).
Both drift silently when someone edits one side; these checks make it loud.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from driver.settingsflags import helm_name
from plugin.settings import PluginSettings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "patchbay"
# Settings the chart fills in itself (downward API, a Secret, tests only).
CHART_SET = {
    "node_name", "pod_uid", "fabric_token", "fabric_token_file", "port_file", "identity",
    "fabric_ca_bundle", "fabric_tls_cert", "fabric_tls_key",  # from tls.secretName
    "webhook_tls_cert", "webhook_tls_key",  # the same Secret's
}  # fmt: skip
# Settings several processes read, with their ONE value: (section, Helm name).
SHARED = {
    "fabric_pool": ("controller", "fabricPool"),
    "fabric_insecure": ("controller", "fabricInsecure"),
}
# The template that sets each section's process environment.
TEMPLATES = {
    "kubeletPlugin": "plugin-daemonset.yaml",
    "controller": "controller.yaml",
    "fabric": "fabric.yaml",
}


def _yaml_names(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*.yaml")}


def test_chart_deviceclasses_are_copies_of_deviceclasses_dir() -> None:
    source, copies = REPO / "deviceclasses", CHART / "deviceclasses"
    assert _yaml_names(copies) == _yaml_names(source), "run `make helm-deviceclasses`"
    for name in sorted(_yaml_names(source)):
        assert (copies / name).read_bytes() == (source / name).read_bytes(), (
            f"helm/patchbay/deviceclasses/{name} differs: run `make helm-deviceclasses`"
        )


def test_chart_deviceclass_files_hold_only_deviceclasses() -> None:
    # The chart renders these files verbatim: anything else in them would be installed too.
    for path in sorted((CHART / "deviceclasses").glob("*.yaml")):
        kinds = [d["kind"] for d in yaml.safe_load_all(path.read_text()) if d]
        assert kinds == ["DeviceClass"], f"{path.name}: {kinds}"


def _settings_models() -> list[tuple[str, type[BaseModel]]]:
    from driver.controller.process.settings import ControllerSettings
    from fabric.service.settings import FabricSettings

    return [
        ("kubeletPlugin", PluginSettings),
        ("controller", ControllerSettings),
        ("fabric", FabricSettings),
    ]


@pytest.mark.parametrize(("section", "model"), _settings_models())
def test_every_setting_has_its_helm_value(section: str, model: type[BaseModel]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())[section]
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"][section]["properties"]
    for field in model.model_fields:
        if field in CHART_SET:
            continue
        if field in SHARED and SHARED[field][0] != section:
            continue  # its value lives in its owner's section
        key = helm_name(field)
        assert key in values, f"values.yaml lacks {section}.{key} (setting --{field})"
        assert key in props, f"values.schema.json lacks {section}.{key}"


@pytest.mark.parametrize(("section", "model"), _settings_models())
def test_helm_value_defaults_match_process_defaults(section: str, model: type[BaseModel]) -> None:
    # A value the chart defaults differently must say why here, not drift by accident.
    chart_differs = {
        ("kubeletPlugin", "metrics_port"),  # the liveness probe needs /healthz
        ("controller", "metrics_port"),  # the same
        ("controller", "webhook_port"),  # passed only with webhook.enabled (0: off)
        ("kubeletPlugin", "registry_dir"),  # derived from kubeletRootDir
        ("kubeletPlugin", "plugin_dir"),  # derived from kubeletRootDir
        ("fabric", "fabric_db"),  # state on the pod's emptyDir
        ("fabric", "listen_address"),  # behind a Service, not loopback
        ("fabric", "fabric_topology"),  # required by the process; the chart mounts it
        ("controller", "fabric_url"),  # required; the chart derives it from the fabric
        ("controller", "lease_namespace"),  # the release namespace, where the Role is
    }
    values = yaml.safe_load((CHART / "values.yaml").read_text())[section]
    for field, info in model.model_fields.items():
        if field in CHART_SET or (section, field) in chart_differs:
            continue
        if field in SHARED and SHARED[field][0] != section:
            continue  # its value lives in its owner's section
        default = "" if info.default is None else info.default
        assert str(values[helm_name(field)]) == str(default), f"{section}.{helm_name(field)}"


@pytest.mark.parametrize("field", sorted(SHARED))
def test_shared_setting_feeds_every_process_from_its_one_value(field: str) -> None:
    from driver.settingsflags import env_name

    owner, key = SHARED[field]
    for section, model in _settings_models():
        if field not in model.model_fields or section not in TEMPLATES:
            continue
        text = (CHART / "templates" / TEMPLATES[section]).read_text()
        lines = [line for line in text.splitlines() if f'"{env_name(field)}"' in line]
        assert lines, f"{TEMPLATES[section]} does not set {env_name(field)}"
        assert all(
            f"{owner}.{key}" in line or (section == owner and f".{key}" in line) for line in lines
        ), f"{TEMPLATES[section]}: {env_name(field)} not from {owner}.{key}: {lines}"
