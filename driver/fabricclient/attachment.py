"""What every dialect shares: a binding as read, its progress, the request helpers.

Why a module: the dialects (``dialect_connections``, ``dialect_zones``,
``dialect_count``) and the seam that picks one (``dialect``) all need these,
and the seam imports the dialects; keeping the shared things here, below
all of them, keeps the imports one-way.

A :class:`Binding` is one Connection or one zone membership as the manager
shows it: every initiator and target endpoint it binds (URIs, endpoint
groups resolved to their endpoints), and its progress. DMTF lets one
Connection bind several initiators and targets
(``InitiatorEndpoints``/``TargetEndpoints`` and their ``...EndpointGroups``)
and one device sit in several Connections; the inventory keeps all of
them. A binding's progress is its ``Status`` (:func:`state_of`): ``State``
``Starting`` attaching, ``Disabled`` detaching, ``UnavailableOffline``
(present, not usable) or else ``Health`` ``Critical`` failed, anything else
attached.

Every attach request carries an ``Idempotency-Key`` header (not a Redfish
standard: a manager that honours it, as our simulator does, answers a
repeat with its first answer instead of attaching twice), derived from the
device, node, adapter and the caller's key (the controller's allocation).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from driver.fabricclient import wire
from driver.fabricclient.model import ConnectionState

IDEMPOTENCY_HEADER = "Idempotency-Key"
STATES: dict[str | None, ConnectionState] = {
    "Starting": "Attaching",
    "Disabled": "Detaching",
    "UnavailableOffline": "Failed",
}


@dataclass(frozen=True)
class Binding:
    """One Connection (or one zone member) binding ``targets`` to ``initiators``
    (endpoint URIs without a trailing slash); ``grouped``: some came from an
    endpoint group, so the binding cannot drop one of them by itself."""

    id: str
    uri: str
    initiators: tuple[str, ...]
    targets: tuple[str, ...]
    state: ConnectionState
    grouped: bool = False


def state_of(status: wire.Status) -> ConnectionState:
    """A binding's progress from its ``Status`` (see the module docstring)."""
    state = STATES.get(status.state)
    if state is None:
        state = "Failed" if status.health == "Critical" else "Attached"
    return state


def idempotency_key(device: str, node: str, adapter: str, key: str = "") -> str:
    """The same for the same attach request (device, node, adapter, caller's key)."""
    return hashlib.sha256("\0".join((device, node, adapter, key)).encode()).hexdigest()[:32]


def link(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def key(uri: str) -> str:
    """A URI as bindings and endpoints are matched: without a trailing slash."""
    return uri.rstrip("/")
