"""What the chart's dashboard and alerts query, read from the chart's files.

Why: the unit tier checks every name they use against what our registries
export, and the integration and e2e tiers against what a running plugin and
controller serve; all three read the names from here. The PromQL reading is
deliberately small: strings, label matchers, ranges and the label lists of
``by``/``on``/... are cut out, and every identifier left that is not a
function call or a keyword is a metric name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from driver.metrics import CONTROLLER, PLUGIN, series_names

CHART = Path(__file__).resolve().parents[1] / "helm" / "patchbay"
DASHBOARD = CHART / "dashboards" / "patchbay.json"
RULES = CHART / "rules" / "patchbay.rules.yaml"
# Series Prometheus makes itself for each target (not any process's).
SCRAPE_SERIES = frozenset({"up"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "group_left", "group_right"})
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENT = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = LABEL_LISTS.sub("", e)
    return {n for n in IDENT.findall(e) if n not in KEYWORDS}


def dashboard_queries() -> dict[str, list[str]]:
    """Each panel's title and its queries (rows have none)."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])]
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


def alert_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def used_metrics() -> set[str]:
    """Every metric name the dashboard and the alerts read."""
    exprs = [e for qs in dashboard_queries().values() for e in qs]
    exprs += alert_expressions().values()
    return {n for e in exprs for n in metric_names(e)} - SCRAPE_SERIES


def exported(component: str) -> set[str]:
    """The series names of ``plugin`` or ``controller`` (``driver.metrics``)."""
    return series_names({"plugin": PLUGIN, "controller": CONTROLLER}[component])


def served_names(families: list[tuple[str, str]]) -> set[str]:
    """Series names a scrape served, from (family name, type) pairs of
    ``prometheus_client.parser`` (it drops a counter's ``_total``)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {name + s for name, kind in families for s in suffixes.get(kind, ("",))}
