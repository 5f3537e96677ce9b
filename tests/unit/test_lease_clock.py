"""The lease clock's decisions, pure: durations, the start stamp and its
skew, the policies that govern a claim, and what is due when (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest

from driver.controller.leases.clock import EVICT, EXPIRE, LEASE_SKEW_S, STAMP, WARN, due
from driver.controller.leases.policies import Terms, parse_policy, selects, terms_for
from driver.errors import ConfigError
from driver.leaseterms import (
    DURATION,
    EXPIRED,
    EXPIRY,
    PHASE,
    START,
    WARNED,
    format_duration,
    parse_duration,
    stamp,
)

T0 = 1_796_083_200.0  # 2026-12-01T00:00:00Z
HOUR = 3600.0


def claim(notes: dict[str, str] | None = None, *, allocated: float | None = T0,
          allocated_without_stamp: bool = False, pods: tuple[str, ...] = ("p",),
          owner: str = "", cls: str = "gpu.patchbay.dev") -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": "c", "namespace": "ns", "uid": "u1",
                            "annotations": dict(notes or {})}  # fmt: skip
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner,
                                    "uid": "o", "controller": True}]  # fmt: skip
    status: dict[str, Any] = {}
    if allocated is not None or allocated_without_stamp:
        status["allocation"] = {"devices": {"results": []}}
        if allocated is not None:
            status["allocation"]["allocationTimestamp"] = stamp(allocated)
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": n + "-uid"} for n in pods]
    spec = {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": cls}}]}}
    return {"metadata": meta, "spec": spec, "status": status}


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"deviceClassNames": ["gpu.patchbay.dev"], **spec}}  # fmt: skip


def test_durations_read_and_write_as_go_writes_them() -> None:
    assert parse_duration("8h") == 8 * HOUR
    assert parse_duration("1h30m") == 1.5 * HOUR
    assert parse_duration("2.5h") == 2.5 * HOUR
    assert parse_duration("90s") == 90
    assert format_duration(5400) == "1h30m"
    assert format_duration(7200) == "2h"
    with pytest.raises(ConfigError, match="lease-duration: 'soon' is not a duration"):
        parse_duration("soon", "lease-duration")


def test_the_lease_starts_at_the_allocation_unless_it_is_ahead_of_our_clock() -> None:
    step, _ = due(claim({DURATION: "2h"}, allocated=T0), Terms(), T0 + 60)
    assert step is not None and step.kind == STAMP
    assert (step.start, step.expiry) == (T0, T0 + 2 * HOUR)  # the controller came late
    ahead = T0 + LEASE_SKEW_S + 1  # the scheduler's clock too far ahead: ours
    step, _ = due(claim({DURATION: "2h"}, allocated=ahead), Terms(), T0)
    assert step is not None and step.start == T0
    step, _ = due(claim({DURATION: "2h"}, allocated=T0 + LEASE_SKEW_S), Terms(), T0)
    assert step is not None and step.start == T0 + LEASE_SKEW_S  # within the skew: as stamped
    step, _ = due(claim({DURATION: "2h"}, allocated=None, allocated_without_stamp=True),
                  Terms(), T0 + 5)  # fmt: skip
    assert step is not None and step.start == T0 + 5  # no allocationTimestamp: ours


def test_no_lease_without_a_duration_or_a_policy_and_none_before_allocation() -> None:
    assert due(claim(), Terms(), T0) == (None, None)
    assert due(claim({DURATION: "1h"}, allocated=None), Terms(), T0) == (None, None)
    step, _ = due(claim(), Terms(default=HOUR), T0)
    assert step is not None and step.expiry == T0 + HOUR
    # A claim asking more than the policies allow now (a policy made since) gets the maximum.
    step, _ = due(claim({DURATION: "9h"}), Terms(maximum=8 * HOUR), T0)
    assert step is not None and step.expiry == T0 + 8 * HOUR


def test_a_stamped_lease_warns_then_expires_then_evicts_until_its_pods_are_gone() -> None:
    notes = {START: stamp(T0), EXPIRY: stamp(T0 + HOUR)}
    terms = Terms(warning=600.0)
    assert due(claim(notes), terms, T0 + 10) == (None, T0 + HOUR - 600)
    step, at = due(claim(notes), terms, T0 + HOUR - 600)
    assert step is not None and step.kind == WARN and at == T0 + HOUR
    warned = {**notes, PHASE: WARNED}
    assert due(claim(warned), terms, T0 + HOUR - 1) == (None, T0 + HOUR)  # warned once
    step, _ = due(claim(warned), terms, T0 + HOUR)
    assert step is not None and step.kind == EXPIRE
    # The controller was down through the warning: it expires without one.
    step, _ = due(claim(notes), terms, T0 + 2 * HOUR)
    assert step is not None and step.kind == EXPIRE
    expired = {**notes, PHASE: EXPIRED}
    step, _ = due(claim(expired), terms, T0 + 3 * HOUR)
    assert step is not None and step.kind == EVICT  # a pod still uses it (a PDB, a restart)
    # A template claim without pods is done; a standalone one until it is deleted.
    assert due(claim(expired, pods=(), owner="p"), terms, T0 + 3 * HOUR) == (None, None)
    step, _ = due(claim(expired, pods=()), terms, T0 + 3 * HOUR)
    assert step is not None and step.kind == EVICT
    deleting = claim(expired, pods=())
    deleting["metadata"]["deletionTimestamp"] = stamp(T0)
    assert due(deleting, terms, T0 + 3 * HOUR) == (None, None)


def test_the_policies_that_govern_a_claim_combine_strictest_first() -> None:
    a = parse_policy(policy("a", defaultDuration="4h", maxDuration="8h", warningBefore="10m",
                            evictionGracePeriodSeconds=60, maxExtension="2h",
                            extendGroups=["leads", "ops"]))  # fmt: skip
    b = parse_policy(policy("b", defaultDuration="6h", maxDuration="6h", warningBefore="30m",
                            evictionGracePeriodSeconds=10, maxExtension="1h",
                            maxExtensionTotal="3h", extendGroups=["ops"],
                            namespaceSelector={"matchLabels": {"team": "ml"}}))  # fmt: skip
    other = parse_policy({"metadata": {"name": "o"}, "spec": {"deviceClassNames": ["x"]}})
    terms = terms_for(claim(), [a, b, other], {"team": "ml"})
    assert terms.policies == ("a", "b")
    assert (terms.default, terms.maximum, terms.warning, terms.grace) == (
        4 * HOUR, 6 * HOUR, 1800.0, 10,
    )  # fmt: skip
    assert (terms.max_extension, terms.max_extension_total) == (HOUR, 3 * HOUR)
    assert terms.extend_groups == {"ops"}
    assert terms_for(claim(), [a, b], {"team": "web"}).policies == ("a",)
    assert terms_for(claim(cls="mig.patchbay.dev"), [a, b], {"team": "ml"}) == Terms()
    # Without maxExtension in every policy that governs it, no extension.
    c = parse_policy(policy("c", maxDuration="8h"))
    assert terms_for(claim(), [a, c], {}).max_extension is None
    assert c.max_extension_total == 8 * HOUR  # maxExtensionTotal defaults to maxDuration


@pytest.mark.parametrize(("selector", "labels", "verdict"), [
    ({}, {}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"},
     True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
])  # fmt: skip
def test_a_namespace_selector_reads_as_the_apiservers(
    selector: dict[str, Any], labels: dict[str, str], verdict: bool
) -> None:
    assert selects(selector, labels) is verdict
