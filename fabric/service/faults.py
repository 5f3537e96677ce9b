"""Fault injection: the admin knobs and per-device flags, read and changed.

Knobs live in the store so they survive a restart with the state they
affect: ``fail_attaches``/``fail_detaches`` count down one per task created,
latencies override the settings' defaults. Per-device flags: ``health``
(shown as the endpoint's ``Status.Health``; ``Critical`` makes attaches
fail), ``in_use`` (detach refused with 409), ``foreign_owner`` (another
tenant took the device: it shows ``UnavailableOffline`` and attach is 409),
``memory_in_use`` (attached CXL memory: marked in use on its host, which then
refuses the hot-remove; the detach task ends in ``Exception`` saying why and
the device stays attached), ``broken_endpoint`` (a GET of its Endpoint
answers 500, and an expanded Endpoints collection lists it as a bare link,
so a reader meets the 500: one broken resource of a manager that is
otherwise fine), ``refuse_attach`` (an attach of it, in either dialect, is
refused with 400 ``ActionNotSupported``: a manager that will not attach
that device). The last two are kept as knobs per device (``<flag>/<id>``),
so the store's schema stays as it is. Called on the service's worker
thread only.
"""

from __future__ import annotations

import logging
from typing import Any

from fabric.service import hosts
from fabric.service.bodies import FaultsUpdate
from fabric.service.errors import RedfishError, bad_property
from fabric.service.inventory import Inventory
from fabric.service.store import Connection, Store

log = logging.getLogger(__name__)


def apply(store: Store, inv: Inventory, upd: FaultsUpdate) -> None:
    unknown = sorted(set(upd.devices) - set(inv.targets))
    if unknown:
        field = f"devices.{unknown[0]}"
        raise RedfishError(400, "PropertyValueFormatError", f"{field}: no such device", field)
    marks: list[tuple[Connection, bool]] = []
    for dev, f in upd.devices.items():
        if f.memory_in_use is not None:
            marks.append((_attached_memory(store, inv, dev), f.memory_in_use))
    knobs = {
        "fail_attaches": upd.fail_next_attaches,
        "fail_detaches": upd.fail_next_detaches,
        "attach_latency": upd.attach_latency,
        "detach_latency": upd.detach_latency,
    }
    for key, value in knobs.items():
        if value is not None:
            store.set_knob(key, float(value))
    for dev, f in upd.devices.items():
        store.set_device(dev, f.health, f.in_use, f.foreign_owner)
        for flag, value in (("broken_endpoint", f.broken_endpoint),
                            ("refuse_attach", f.refuse_attach)):  # fmt: skip
            if value is not None:
                store.set_knob(f"{flag}/{dev}", float(value))
    for conn, in_use in marks:
        hosts.mark_memory_in_use(inv.initiators[conn.initiator], conn.bdf, in_use)
    log.warning("faults changed: %s", upd.model_dump(exclude_none=True, by_alias=True))


def _attached_memory(store: Store, inv: Inventory, dev: str) -> Connection:
    field = f"devices.{dev}.memoryInUse"
    if inv.targets[dev].kind != "cxlmem":
        raise bad_property(field, f"{dev} is a {inv.targets[dev].kind}, not CXL memory")
    conn = store.connection_of(dev)
    # Detaching: a hot-remove under way (or being refused and retried) leaves
    # the memory on its host until it succeeds, so the mark still applies.
    if conn is None or conn.state not in ("Attached", "Detaching") or not conn.bdf:
        raise bad_property(field, f"{dev} is not attached to a host")
    return conn


def endpoint_broken(store: Store, device: str) -> bool:
    """Whether ``device``'s Endpoint answers 500 (the ``brokenEndpoint`` fault)."""
    return bool(store.knob(f"broken_endpoint/{device}"))


def broken_endpoints(store: Store, ids: list[str]) -> set[str]:
    return {i for i in ids if endpoint_broken(store, i)}


def attach_refused(store: Store, device: str) -> bool:
    """Whether an attach of ``device`` is refused (the ``refuseAttach`` fault)."""
    return bool(store.knob(f"refuse_attach/{device}"))


def view(store: Store, inv: Inventory, defaults: dict[str, float]) -> dict[str, Any]:
    devices = {}
    for ident in sorted(inv.targets):
        d = store.device(ident)
        devices[ident] = {
            "health": d.health, "inUse": d.in_use, "foreignOwner": d.foreign_owner,
            "brokenEndpoint": endpoint_broken(store, ident),
            "refuseAttach": attach_refused(store, ident),
        }  # fmt: skip
    return {
        "failNextAttaches": int(store.knob("fail_attaches")),
        "failNextDetaches": int(store.knob("fail_detaches")),
        "attachLatencySeconds": store.knob("attach_latency", defaults["attach_latency"]),
        "detachLatencySeconds": store.knob("detach_latency", defaults["detach_latency"]),
        "devices": devices,
    }
