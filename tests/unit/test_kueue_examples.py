"""The Kueue examples stay countable by Kueue v0.17 and name real classes.

Why: Kueue v0.17 refuses a ResourceClaimTemplate with selectors, constraints,
config, firstAvailable, adminAccess or allocationMode All, and a class missing
from its deviceClassMappings makes a Workload inadmissible (docs/kueue.md).
The e2e test runs a few of these objects; this checks all of them, in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUEUE = REPO / "deviceclasses" / "examples" / "kueue"


def _docs(name: str) -> list[Any]:
    return [d for d in yaml.safe_load_all((KUEUE / name).read_text()) if d]


def _mappings() -> dict[str, str]:
    (config,) = _docs("kueue-config.yaml")
    return {
        cls: m["name"]
        for m in config["resources"]["deviceClassMappings"]
        for cls in m["deviceClassNames"]
    }


def test_mapped_classes_are_shipped_deviceclasses() -> None:
    shipped = {p.name.removesuffix(".yaml") for p in (REPO / "deviceclasses").glob("*.yaml")}
    assert set(_mappings()) <= shipped
    assert {f"mig-{n}g.patchbay.dev" for n in (1, 2, 3, 4, 7)} <= set(_mappings())


def test_templates_use_only_what_kueue_v017_counts() -> None:
    mapped = _mappings()
    for tmpl in _docs("templates.yaml"):
        devices = tmpl["spec"]["spec"]["devices"]
        assert set(devices) == {"requests"}, tmpl["metadata"]["name"]  # no constraints/config
        for request in devices["requests"]:
            assert set(request) == {"name", "exactly"}, request  # no firstAvailable
            exactly = request["exactly"]
            assert set(exactly) <= {"deviceClassName", "count"}, request
            assert exactly["deviceClassName"] in mapped, request


def test_queue_quotas_name_mapped_resources() -> None:
    resources = set(_mappings().values())
    for cq in (d for d in _docs("queues.yaml") if d["kind"] == "ClusterQueue"):
        for group in cq["spec"]["resourceGroups"]:
            assert set(group["coveredResources"]) <= resources
