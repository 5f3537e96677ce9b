"""Device-seconds, and the time leases have left: the keeper's figures per claim.

Why: the figure a platform team asks for ("how much of what we pay for is
used", issue 37) is the device-seconds claims hold against the
device-seconds their devices sat idle. Two counters in the controller
(``patchbay_device_seconds_allocated_total`` and
``patchbay_device_seconds_idle_total``, ``driver.metrics``), labelled by the
claim's namespace (``claim_namespace``: a scraper's own ``namespace``, the
controller pod's, would rename a ``namespace`` label), the lease's holder
(``unknown`` where none was recorded) and the device's DeviceClass:
``rate()`` of each is the devices held (idle) on average, and their ratio
the idle share.

How: the lease keeper calls :meth:`DeviceSeconds.advance` at each pass (at
every claim change and at least once a minute); the time since the
previous pass is credited to the devices as the previous pass saw them,
then the claims as they are now become the new picture. A device counts
as allocated while its claim is allocated, and as idle while its node
reports it ``Idle=True`` (``driver.idleterms``): so idle time starts at the
node's report, one idle window after the device went low. Only the leader
counts, from the moment it leads: a leader change loses the seconds
between the two. Time is the caller's monotonic clock.

``patchbay_device_lease_seconds_to_expiry`` (:func:`seconds_to_expiry`,
read at each scrape) says, per claim whose lease runs (active or warned),
how long it has left by the wall clock the stamps use: what an alert on
"a lease ends within the hour" needs, which ``patchbay_device_leases``
(counts by state) cannot tell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from driver import DRIVER_NAME
from driver.idleterms import report_of
from driver.leaseterms import WARNED, lease_of
from driver.metrics import ALLOCATED_DEVICE_SECONDS, IDLE_DEVICE_SECONDS, Samples

Labels = tuple[str, str, str]  # namespace, holder, class


def _classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Request (and ``request/subrequest``) name: its DeviceClass."""
    out = {}
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = str(r.get("name") or "")
        exactly = r.get("exactly") or {}
        if exactly.get("deviceClassName"):
            out[name] = str(exactly["deviceClassName"])
        for sub in r.get("firstAvailable") or ():
            out[f"{name}/{sub.get('name')}"] = str(sub.get("deviceClassName") or "")
    return out


def holdings(claims: Iterable[Mapping[str, Any]]) -> dict[Labels, tuple[int, int]]:
    """Devices of ours held (and of those, reported idle) by label set."""
    out: dict[Labels, tuple[int, int]] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        if not results:
            continue
        lease = lease_of(claim)
        classes = _classes(claim)
        idle = {
            (e.get("pool"), e.get("device"), e.get("shareID"))
            for e in status.get("devices") or ()
            if e.get("driver") == DRIVER_NAME
            and any(report_of("", c) is not None for c in e.get("conditions") or ())
        }
        for r in results:
            if r.get("driver") != DRIVER_NAME:
                continue
            cls = classes.get(str(r.get("request") or ""), "")
            labels = (lease.namespace, lease.holder or "unknown", cls or "unknown")
            held, low = out.get(labels, (0, 0))
            key = (r.get("pool"), r.get("device"), r.get("shareID"))
            out[labels] = (held + 1, low + (1 if key in idle else 0))
    return out


def seconds_to_expiry(claims: Iterable[Mapping[str, Any]], now: float) -> Samples:
    """((namespace, name), seconds left) of each claim whose lease runs at ``now``
    (stamped, not yet expired, reclaimed or audited)."""
    out = []
    for claim in claims:
        lease = lease_of(claim)
        if lease.expiry is not None and lease.phase in ("", WARNED):
            out.append(((lease.namespace, lease.name), lease.expiry - now))
    return out


class DeviceSeconds:
    """Adds up device-seconds between the keeper's passes."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._held: dict[Labels, tuple[int, int]] = {}

    def advance(self, now: float, claims: Iterable[Mapping[str, Any]]) -> None:
        """Credit the time since the last call to what it saw; take ``claims`` as now."""
        if self._last is not None:
            elapsed = max(0.0, now - self._last)
            for labels, (held, low) in self._held.items():
                if elapsed and held:
                    ALLOCATED_DEVICE_SECONDS.labels(*labels).inc(held * elapsed)
                if elapsed and low:
                    IDLE_DEVICE_SECONDS.labels(*labels).inc(low * elapsed)
        self._last = now
        self._held = holdings(claims)
