"""One device's recent utilization and whether it is idle.

Why: "idle" is a verdict over time, not one reading: utilization below the
threshold for the whole window (issue 37, "utilization below X % for Y
minutes"). The window keeps the readings of the last ``window`` seconds (for
the highest one, which the Idle condition's message names) and when the
current stretch of low readings began. A reading at or above the threshold,
or one NVML could not give (None: "a device whose utilization is unknown
is never idle"), ends the stretch. Times are the caller's monotonic clock,
in seconds, injected so tests decide without sleeping.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass


class Verdict(enum.Enum):
    IDLE = "idle"  # below the threshold for the whole window
    ACTIVE = "active"  # the last reading is known; not (yet) idle
    UNKNOWN = "unknown"  # the last reading could not be taken: never idle


@dataclass(frozen=True)
class IdlePolicy:
    threshold: float  # percent; below it is low
    window: float  # seconds low before idle


class UtilizationWindow:
    """The readings of one device over the last ``policy.window`` seconds."""

    def __init__(self, policy: IdlePolicy) -> None:
        self.policy = policy
        self._readings: deque[tuple[float, float | None]] = deque()
        self.low_since: float | None = None  # start of the current low stretch

    def observe(self, now: float, percent: float | None) -> None:
        """A reading taken at ``now`` (None: NVML gave none)."""
        self._readings.append((now, percent))
        while self._readings and self._readings[0][0] < now - self.policy.window:
            self._readings.popleft()
        if percent is None or percent >= self.policy.threshold:
            self.low_since = None
        elif self.low_since is None:
            self.low_since = now

    @property
    def observed(self) -> bool:
        """Whether any reading was taken (in the window)."""
        return bool(self._readings)

    @property
    def latest(self) -> float | None:
        return self._readings[-1][1] if self._readings else None

    def highest(self) -> float | None:
        """The highest known reading in the window."""
        known = [p for _, p in self._readings if p is not None]
        return max(known) if known else None

    def low_for(self, now: float) -> float:
        """Seconds the device has been below the threshold (0 when it is not)."""
        return 0.0 if self.low_since is None else max(0.0, now - self.low_since)

    def verdict(self, now: float) -> Verdict:
        if not self._readings or self._readings[-1][1] is None:
            return Verdict.UNKNOWN
        if self.low_since is not None and now - self.low_since >= self.policy.window:
            return Verdict.IDLE
        return Verdict.ACTIVE
