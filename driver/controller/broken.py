"""Broken fabric resources told to the operator, whether or not a claim meets them.

Why: a fabric read keeps what it could read and records each resource it
could not use (``FabricInventory.broken``: its URI and why). A claim that
waits for, or holds, a device such a resource leaves in doubt is told on the
claim (``driver.controller.attach.cases``, the reconciler's doubts); but a
broken resource that no claim touches (a free device's Endpoint, a Port, a
collection link) would otherwise show only in the controller's log, and an
operator would learn of it when a claim first meets it. So each one is a
``FabricResourceBroken`` Warning Event, naming the URI, the error and the
devices it holds back, once per distinct breakage: again only after the
resource was read whole (or broke in another way), never once per read.

The Events are on the controller's leader Lease: the fabric is the
controller's as a whole, not one Node's or claim's, and the Lease is the one
object that stands for "the controller" across replicas and rollouts (a Pod
changes with each), found where the controller runs (``kubectl describe
lease -n <lease namespace> <lease name>``, ``kubectl get events -n <lease
namespace>``). The chart's controller ClusterRole already creates Events in
every namespace; the leader Role already reads its Lease (for its uid,
which ``kubectl describe`` matches Events by).

Concurrency: used on the controller's asyncio loop only.
"""

from __future__ import annotations

import logging
from typing import Protocol

from driver.controller.events import ControllerEvents
from driver.errors import ApiError
from driver.fabricclient.model import FabricInventory
from driver.kube.client import KubeClient
from driver.kube.events import ObjectRef

log = logging.getLogger(__name__)

LEASE_API = "coordination.k8s.io/v1"


class LeaseNamed(Protocol):
    """Where the leader Lease is (``process.settings.ControllerSettings``)."""

    @property
    def lease_namespace(self) -> str: ...
    @property
    def lease_name(self) -> str: ...


class BrokenResources:
    """What the fabric's reads could not use, told once per breakage."""

    def __init__(self, api: KubeClient, events: ControllerEvents, lease: LeaseNamed) -> None:
        self._api = api
        self._events = events
        self._lease = ObjectRef("Lease", lease.lease_name, lease.lease_namespace, "", LEASE_API)
        self._told: dict[str, str] = {}  # URI -> why, as last told

    async def seen(self, inv: FabricInventory) -> None:
        """Tell each resource ``inv`` found broken that was not broken so, in
        the last read; forget those read whole again."""
        now = dict(inv.broken)
        for uri in sorted(set(self._told) - set(now)):
            log.info("fabric resource %s is readable again", uri)
        new = sorted((uri, why) for uri, why in now.items() if self._told.get(uri) != why)
        self._told = now
        if not new:
            return
        lease = await self._lease_ref()
        for uri, why in new:
            held = sorted(d for d, reason in inv.held_back if uri in reason)
            log.warning("fabric resource %s is broken: %s (holds back: %s)",
                        uri, why, ", ".join(held) or "no device")  # fmt: skip
            self._events.resource_broken(lease, uri, why, held)

    async def _lease_ref(self) -> ObjectRef:
        """The leader Lease's reference, with its uid once it is read."""
        if not self._lease.uid:
            ref = self._lease
            path = f"/apis/{LEASE_API}/namespaces/{ref.namespace}/leases/{ref.name}"
            try:
                self._lease = ObjectRef.of(await self._api.get(path), "Lease", LEASE_API)
            except ApiError as exc:  # the Event is still written, without the uid
                log.info("reading the leader Lease %s/%s: %s", ref.namespace, ref.name, exc)
        return self._lease
