"""The lease keeper: stamps, warns, expires and evicts, on the leader.

Why: a lease (docs/leases.md) needs someone to start its clock when its
claim is allocated, warn before it ends and take the devices back at the
end, and that someone may die and be replaced at any moment. The keeper
holds nothing of its own: each pass reads the claims, the
DeviceLeasePolicies and the namespaces' labels from list+watch caches, asks
``clock.due`` what each claim needs now, and writes the outcome on the claim
(with its ``resourceVersion`` as a precondition, so a pass working from a
stale view is refused instead of repeating a step) before it announces it.
At expiry the claim is marked expired, the claim and its pods get a Warning
Event, a standalone claim is deleted (it is never handed out again; the
apiserver keeps it until its pods are gone) and the pods that use it are
evicted through the Eviction API with the policies' grace period. An
eviction a PodDisruptionBudget refuses is reported (Event on the pod and the
claim, ``patchbay_device_lease_evictions_blocked_total``) and retried with
jittered backoff, never bypassed.

Idle devices (``driver.controller.leases.idle``): a claim whose devices its
node reports ``Idle`` long enough under a policy whose ``idle.action`` is
``Reclaim`` is marked reclaimed and takes the same path as expiry (Events,
a standalone claim deleted, evictions, a budget honoured); ``Event`` gives
the claim and its pods a Warning once per idle stretch. Under policies in
audit mode (``spec.audit``) expiry and reclaim only report what they would
do (``LeaseWouldEvict``, ``patchbay_device_lease_would_evict_total``). Each
pass also adds up the device-seconds held and idle
(``driver.controller.leases.usage``).

Concurrency: one asyncio task (:meth:`LeaseKeeper.run`) with its caches;
passes run one at a time. Wall time decides (the stamps outlive the
process); the wait between passes is the loop's monotonic timeout, at most
``MAX_WAIT_S`` so a wall clock that jumps is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from driver.backoff import Backoff
from driver.controller.events import ControllerEvents
from driver.controller.leases import notes as say
from driver.controller.leases.clock import (
    EVICT,
    EXPIRE,
    EXTEND,
    IDLE_RECLAIM,
    IDLE_REPORT,
    STAMP,
    WARN,
    Step,
    due,
)
from driver.controller.leases.evictions import BLOCKED, EVICTED, evict
from driver.controller.leases.idle import WOULD_RECLAIM, IdleDue, unprovable
from driver.controller.leases.policies import (
    POLICIES_PATH,
    Policy,
    Terms,
    extension_refusal,
    parse_policy,
    terms_for,
)
from driver.controller.leases.usage import DeviceSeconds, seconds_to_expiry
from driver.errors import ApiError, ApiStatusError, ConfigError
from driver.kube.api import RESOURCE_V1, claim_path
from driver.kube.cache import ObjectCache
from driver.kube.client import KubeClient
from driver.kube.events import ObjectRef
from driver.leaseterms import (
    AUDIT_EXPIRED,
    EXPIRED,
    EXPIRY,
    EXTENDED,
    EXTENDED_ID,
    HOLDER,
    IDLE_NOTED,
    PHASE,
    RECLAIMED,
    START,
    STATES,
    WARNED,
    format_duration,
    lease_of,
    owner_pod,
    parse_duration,
    stamp,
    users,
)
from driver.metrics import (
    LEASE_EVICTIONS,
    LEASE_EVICTIONS_BLOCKED,
    LEASE_SECONDS_TO_EXPIRY,
    LEASE_WOULD_EVICT,
    LEASES,
)

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0


class LeaseKeeper:
    def __init__(
        self,
        api: KubeClient,
        events: ControllerEvents,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.events = events
        self.wall = wall  # the lease stamps' clock (tests inject their own)
        self.monotonic = monotonic  # eviction retries
        self._dirty = asyncio.Event()
        self.claims = ObjectCache(api, f"{RESOURCE_V1}/resourceclaims", self.mark)
        self.policies = ObjectCache(api, POLICIES_PATH, self.mark)
        self.namespaces = ObjectCache(api, "/api/v1/namespaces", self.mark)
        self._retries: dict[str, tuple[float, Backoff]] = {}  # claim uid: next try, backoff
        self._told: set[tuple[str, float | None]] = set()  # (policy, node threshold) reported
        self.usage = DeviceSeconds()
        LEASES.add_source(self, LeaseKeeper.states)
        LEASE_SECONDS_TO_EXPIRY.add_source(
            self, lambda k: seconds_to_expiry(k.claims.objects.values(), k.wall())
        )

    def mark(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.claims.run(), name="lease-claims")
            group.create_task(self.policies.run(), name="lease-policies")
            group.create_task(self.namespaces.run(), name="lease-namespaces")
            group.create_task(self._loop(), name="lease-clock")

    async def _loop(self) -> None:
        while True:
            self._dirty.clear()
            delay = await self.tick()
            wait = MAX_WAIT_S if delay is None else min(max(delay, 0.0), MAX_WAIT_S)
            with contextlib.suppress(TimeoutError):  # not wait_for: docs/design.md
                async with asyncio.timeout(wait):
                    await self._dirty.wait()

    def synced(self) -> bool:
        caches = (self.claims, self.policies, self.namespaces)
        return all(c.synced.is_set() for c in caches)

    def _policies(self) -> list[Policy]:
        out = []
        for obj in self.policies.objects.values():
            try:
                out.append(parse_policy(obj))
            except ConfigError as exc:  # the CRD checks them: a stored one is well formed
                log.warning("%s: ignored", exc)
        return out

    def terms(self, claim: Mapping[str, Any], policies: Iterable[Policy]) -> Terms:
        ns = str((claim.get("metadata") or {}).get("namespace") or "")
        labels = ((self.namespaces.objects.get(ns) or {}).get("metadata") or {}).get("labels")
        return terms_for(claim, policies, labels or {})

    async def tick(self) -> float | None:
        """One pass over every claim; seconds until the next step falls due
        (None: nothing waits). Waits for nothing while the caches fill."""
        if not self.synced():
            return None
        now, policies, waits = self.wall(), self._policies(), []
        self.usage.advance(self.monotonic(), self.claims.objects.values())
        for claim in list(self.claims.objects.values()):
            terms = self.terms(claim, policies)
            self._tell_unprovable(claim, terms)
            step, at = due(claim, terms, now)
            if at is not None:
                waits.append(at - now)
            if step is None:
                continue
            if step.kind == EVICT:
                retry = self._retries.get(step.lease.uid)
                if retry is not None and retry[0] > self.monotonic():
                    waits.append(retry[0] - self.monotonic())
                    continue
            try:
                await self._do(step, claim, terms)
            except ApiError as exc:
                log.warning("lease of claim %s: %s failed: %s", step.lease.key, step.kind, exc)
                waits.append(self._retry_later(step.lease.uid))
        return min(waits) if waits else None

    def _retry_later(self, uid: str) -> float:
        backoff = self._retries.get(uid, (0.0, Backoff(1.0, 60.0, jitter=0.5)))[1]
        delay = backoff.next()
        self._retries[uid] = (self.monotonic() + delay, backoff)
        return delay

    async def _do(self, step: Step, claim: Mapping[str, Any], terms: Terms) -> None:
        if step.kind == STAMP:
            await self._stamp(step, claim, terms)
        elif step.kind == WARN:
            await self._warn(step, claim)
        elif step.kind == EXPIRE:
            await self._expire(step, claim, terms)
        elif step.kind == EXTEND:
            await self._extend(step, claim, terms)
        elif step.kind == IDLE_RECLAIM and step.idle is not None:
            await self._reclaim(step, step.idle, claim, terms)
        elif step.kind == IDLE_REPORT and step.idle is not None:
            await self._report_idle(step, step.idle, claim)
        elif step.kind == EVICT:
            await self._evict(
                step, claim, terms, "idle" if step.lease.phase == RECLAIMED else "expiry"
            )

    async def _write(self, claim: Mapping[str, Any], notes: Mapping[str, str | None]) -> bool:
        """Merge ``notes`` into the claim's annotations if it is as we saw it;
        False when it changed since (the next pass sees the new one)."""
        meta = claim.get("metadata") or {}
        path = claim_path(str(meta.get("namespace")), str(meta.get("name")))
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": notes}}
        try:
            stored = await self.api.merge_patch(path, body)
        except ApiStatusError as exc:
            if exc.conflict or exc.not_found:
                self.mark()
                return False
            raise
        self.claims.objects[ObjectCache.key(stored)] = stored  # until the watch brings it
        return True

    async def _holder(self, claim: Mapping[str, Any], holder_pod: str) -> str | None:
        """The holder recorded on a template claim's owner Pod (None: not known)."""
        if not holder_pod or holder_pod != owner_pod(claim):
            return None
        ns = str((claim.get("metadata") or {}).get("namespace"))
        try:
            pod = await self.api.get(f"/api/v1/namespaces/{ns}/pods/{holder_pod}")
        except ApiStatusError as exc:
            if exc.not_found:
                return None
            raise
        holder = ((pod.get("metadata") or {}).get("annotations") or {}).get(HOLDER)
        return str(holder) if holder else None

    async def _stamp(self, step: Step, claim: Mapping[str, Any], terms: Terms) -> None:
        notes = {START: stamp(step.start), EXPIRY: stamp(step.expiry)}
        holder = await self._holder(claim, step.lease.holder_pod)
        if holder:
            notes[HOLDER] = holder
        if await self._write(claim, notes):
            who = holder or step.lease.holder or "unknown"
            length = format_duration(step.expiry - step.start)
            by = f" (DeviceLeasePolicy {', '.join(terms.policies)})" if terms.policies else ""
            log.info("lease of claim %s started: %s for %s", step.lease.key, who, length)
            note = f"lease of {who} started: {length}{by}, until {notes[EXPIRY]}"
            self.events.lease_started(say.claim_ref(claim), note)

    async def _extend(self, step: Step, claim: Mapping[str, Any], terms: Terms) -> None:
        """Apply an extension the admission let through, if the terms allow it
        now too (a policy may have changed since, or none governs the claim)."""
        lease, expiry = step.lease, step.lease.expiry or 0.0
        refused = extension_refusal(lease.extend_by, lease.extended, terms)
        who = lease.extend_requester or "unknown"
        if refused:
            if await self._write(claim, {EXTENDED_ID: lease.extend_id}):
                note = f"extension by {lease.extend_by} asked by {who} refused: {refused}"
                self.events.extension_refused(say.claim_ref(claim), note)
            return
        by = parse_duration(lease.extend_by)
        total = lease.extended + by
        notes: dict[str, str | None] = {
            EXPIRY: stamp(expiry + by), EXTENDED: format_duration(total),
            EXTENDED_ID: lease.extend_id, PHASE: None,  # warned again before the new end
        }  # fmt: skip
        if await self._write(claim, notes):
            note = (f"{who} extended the lease by {lease.extend_by} ({format_duration(total)} in "
                    f"all): {lease.extend_reason or 'no reason given'}; it now ends at "
                    f"{notes[EXPIRY]}")  # fmt: skip
            log.info("lease of claim %s: %s", lease.key, note)
            self.events.lease_extended(say.claim_ref(claim), note)

    async def _warn(self, step: Step, claim: Mapping[str, Any]) -> None:
        if await self._write(claim, {PHASE: WARNED}):
            expiry = stamp(step.lease.expiry or 0.0)
            left = format_duration((step.lease.expiry or 0.0) - self.wall())
            note = (f"the device lease of {step.lease.holder or 'unknown'} ends at {expiry} (in "
                    f"{left}): its pods will be evicted then; extend it with kubectl patchbay "
                    f"lease extend")  # fmt: skip
            self.events.lease_expiring(say.refs(claim), note)

    async def _expire(self, step: Step, claim: Mapping[str, Any], terms: Terms) -> None:
        ended = say.ended(step.lease)
        if terms.audit:
            if await self._write(claim, {PHASE: AUDIT_EXPIRED}):
                self._would_evict(claim, "expiry", ended)
            return
        if not await self._write(claim, {PHASE: EXPIRED}):
            return
        note = f"{ended}: {say.taking(claim, terms)}"
        log.info("lease of claim %s expired: %s", step.lease.key, note)
        self.events.lease_expired(say.refs(claim), note)
        await self._evict(step, claim, terms, "expiry")

    async def _reclaim(
        self, step: Step, idle: IdleDue, claim: Mapping[str, Any], terms: Terms
    ) -> None:
        """Take an idle claim's devices back, as expiry does (its state first)."""
        if not await self._write(claim, {PHASE: RECLAIMED, IDLE_NOTED: idle.noted}):
            return
        note = f"{say.idle(idle, step.lease.holder)}: {say.taking(claim, terms)}"
        log.info("lease of claim %s reclaimed: %s", step.lease.key, note)
        self.events.idle_reclaimed(say.refs(claim), note)
        await self._evict(step, claim, terms, "idle")

    async def _report_idle(self, step: Step, idle: IdleDue, claim: Mapping[str, Any]) -> None:
        """Once per idle stretch: a Warning (Event), or what a reclaim would do (audit)."""
        if not await self._write(claim, {IDLE_NOTED: idle.noted}):
            return
        note = say.idle(idle, step.lease.holder)
        if idle.action == WOULD_RECLAIM:
            self._would_evict(claim, "idle", note)
            return
        log.info("lease of claim %s: %s", step.lease.key, note)
        self.events.devices_idle(say.refs(claim), note)

    def _would_evict(self, claim: Mapping[str, Any], cause: str, what: str) -> None:
        LEASE_WOULD_EVICT.labels(cause).inc(len(users(claim)))
        note = say.would_evict(claim, what)
        log.info("claim %s: %s", ObjectCache.key(claim), note)
        self.events.would_evict(say.refs(claim), note)

    def _tell_unprovable(self, claim: Mapping[str, Any], terms: Terms) -> None:
        """On the policy, once per process and node threshold: an idle rule
        stricter than the node's reports can show never fires."""
        node, rules = unprovable(claim, terms.idle)
        for rule in rules:
            if (rule.policy, node) in self._told:
                continue
            self._told.add((rule.policy, node))
            note = say.unprovable(rule, node, ObjectCache.key(claim))
            log.warning("DeviceLeasePolicy %s: %s", rule.policy, note)
            found = [p for p in self.policies.objects.values()
                     if (p.get("metadata") or {}).get("name") == rule.policy]  # fmt: skip
            obj = found[0] if found else {"metadata": {"name": rule.policy}}
            ref = ObjectRef.of(obj, "DeviceLeasePolicy", "patchbay.dev/v1alpha1")
            self.events.idle_threshold_below_node(ref, note)

    async def _evict(self, step: Step, claim: Mapping[str, Any], terms: Terms, cause: str) -> None:
        """Delete an expired standalone claim (once; the apiserver keeps it
        until no pod uses it) and evict the pods that use the claim."""
        meta = claim.get("metadata") or {}
        if not owner_pod(claim) and not meta.get("deletionTimestamp"):
            path = claim_path(str(meta.get("namespace")), str(meta.get("name")))
            with contextlib.suppress(ApiStatusError):  # gone already, or another claim now
                await self.api.delete(path, {"preconditions": {"uid": step.lease.uid}})
        blocked = False
        for name, uid in users(claim):
            outcome = await evict(self.api, step.lease.namespace, name, uid, terms.grace)
            if outcome.kind == EVICTED:
                LEASE_EVICTIONS.labels(cause).inc()
                log.info("lease of claim %s: pod %s evicted (%s)", step.lease.key, name, cause)
            elif outcome.kind == BLOCKED:
                blocked = True
                LEASE_EVICTIONS_BLOCKED.inc()
                pod = ObjectRef("Pod", name, step.lease.namespace, uid)
                why = "idle devices" if cause == "idle" else "expired device lease"
                note = (f"evicting pod {name} for the {why} of claim "
                        f"{step.lease.name} is refused, retried: {outcome.why}")  # fmt: skip
                self.events.eviction_blocked((pod, say.claim_ref(claim)), note)
        if blocked:
            self._retry_later(step.lease.uid)
        else:
            self._retries.pop(step.lease.uid, None)

    def states(self) -> list[tuple[tuple[str], float]]:
        counts = {"active": 0, "expiring": 0, "expired": 0, "reclaimed": 0, "audited": 0}
        for claim in self.claims.objects.values():
            lease = lease_of(claim)
            state = STATES.get(lease.phase, "active")
            if lease.start is None and lease.phase != RECLAIMED:
                continue
            counts[state] += 1
        return [((state,), float(n)) for state, n in counts.items()]
