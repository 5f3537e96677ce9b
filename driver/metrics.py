"""A tiny in-process metrics registry with Prometheus text output.

patchbay exports a handful of counters and gauges (slice writes, prepare
calls and failures, prepared claims). A full client library would cost
memory for features we do not use; this module keeps labelled values and
renders the text exposition format.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Metric:
    """A counter or gauge with optional labels."""

    def __init__(self, name: str, help_text: str, kind: str = "counter") -> None:
        self.name = name
        self.help = help_text
        self.kind = kind
        self._values: dict[tuple[tuple[str, str], ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = value

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def total(self) -> float:
        return sum(self._values.values())

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            labels = ",".join(f'{k}="{v}"' for k, v in key)
            yield f"{self.name}{{{labels}}} {value:g}" if labels else f"{self.name} {value:g}"


class Registry:
    """The metrics of one process."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def metric(self, name: str, help_text: str, kind: str = "counter") -> Metric:
        if name not in self._metrics:
            self._metrics[name] = Metric(name, help_text, kind)
        return self._metrics[name]

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


REGISTRY = Registry()
SLICE_WRITES = REGISTRY.metric(
    "patchbay_resourceslice_writes_total", "ResourceSlice create/update/delete calls by operation"
)
PREPARE_CALLS = REGISTRY.metric(
    "patchbay_prepare_claims_total", "Claims handled by NodePrepareResources, by result"
)
UNPREPARE_CALLS = REGISTRY.metric(
    "patchbay_unprepare_claims_total", "Claims handled by NodeUnprepareResources, by result"
)
PREPARED_CLAIMS = REGISTRY.metric(
    "patchbay_prepared_claims", "Claims currently prepared on this node", "gauge"
)
