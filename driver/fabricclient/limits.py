"""The fabric client's limits on what a manager may cost it: one owner, as settings.

Why a module: a fabric manager is a remote program the client must survive
when it misbehaves. Two of its misbehaviours cannot be bounded by the
request timeout alone: an answer far larger than any Redfish resource
(a 10 MB endpoint cost the client 41 MB of memory before this cap), and a
task monitor that answers "still running" for ever. Each bound is a setting
here (flag ``--fabric-max-body-bytes``, env ``FABRIC_MAX_BODY_BYTES``, Helm
``fabricMaxBodyBytes``; likewise ``fabric_task_max_polls``), read by
:class:`~driver.fabricclient.transport.Transport` and
:class:`~driver.fabricclient.operations.Operations`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

# An expanded collection of a thousand endpoints is about 2 MB; one resource a few kB.
MAX_BODY_BYTES = 8 << 20
# Polls of one task handle: at most every 2 s once backed off, about half an hour.
TASK_MAX_POLLS = 900


class FabricLimitsSettings(BaseModel):
    fabric_max_body_bytes: int = Field(
        default=MAX_BODY_BYTES,
        ge=4096,
        description="the largest body the client reads from the fabric manager, in bytes; a "
        "larger answer fails that request, naming the resource",
    )
    fabric_task_max_polls: int = Field(
        default=TASK_MAX_POLLS,
        ge=1,
        description="polls of one attach/detach task before the client gives up on it "
        "(a task monitor that never ends), whatever the caller's timeout",
    )
