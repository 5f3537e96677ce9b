"""``kubectl patchbay lease extend CLAIM --by 2h --reason "..."``: ask for more time.

Why: a lease's expiry is written by patchbay only (docs/leases.md), so a
user asks for an extension instead: this writes the request on the claim,
in the user's own annotations (how much, why, and a new request id), as
the user. The apiserver judges it at once against the DeviceLeasePolicies
that govern the claim (within ``maxExtension`` and the total cap, by the
holder, a member of a named group or who may ``extend`` the policy by
RBAC; the chart's ``leases.yaml``) and
records who asked; a refusal comes back here with the policy's message.
The controller then moves the expiry and records an Event naming who
extended it, by how much and why (``LeaseExtended``).
"""

from __future__ import annotations

import uuid

from driver.kube.api import claim_path
from driver.kube.client import KubeClient
from driver.leaseterms import EXTEND_BY, EXTEND_ID, EXTEND_REASON, parse_duration


async def request_extension(
    api: KubeClient, namespace: str, claim: str, by: str, reason: str
) -> str:
    """Write the request on the claim; its id. A ConfigError for a ``by`` that
    is no duration, an ApiStatusError with the apiserver's refusal."""
    parse_duration(by, "--by")
    request_id = uuid.uuid4().hex[:12]
    notes = {EXTEND_BY: by, EXTEND_REASON: reason, EXTEND_ID: request_id}
    await api.merge_patch(claim_path(namespace, claim), {"metadata": {"annotations": notes}})
    return request_id
