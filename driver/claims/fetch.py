"""Reading the claims of a kubelet call, before any lock is taken.

Why this module exists: the claim GET is the slow and failure-prone part of
a prepare (most of its latency; with etcd down it hangs until its request
timeout). Read under the claim lock, one hanging read would hold up every
unprepare and every other pod's prepare behind it; read before the lock, a
burst of calls reads concurrently and only the local work (checkpoint, CDI
spec, device handlers) is serialised. What a read cannot know is settled
under the lock: a claim another call completed meanwhile keeps its recorded
result, one that still needs an object it was not read for is read there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from driver.claims.model import ClaimRef, Fetched

log = logging.getLogger(__name__)


class ClaimReader(Protocol):
    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


async def read_claims(
    reader: ClaimReader, claims: Sequence[ClaimRef], needs_read: Callable[[str], bool]
) -> Fetched:
    """Read every claim ``needs_read`` (by UID) says is not prepared yet,
    concurrently (a pod's claims arrive in one call); a failed read is kept
    for its claim and never raised."""
    wanted = [ref for ref in claims if needs_read(ref.uid)]
    started = time.perf_counter()
    answers: list[Mapping[str, Any] | BaseException]
    if len(wanted) == 1:  # the usual call: one read needs no task of its own
        try:
            answers = [await reader.read_claim(wanted[0].namespace, wanted[0].name)]
        except Exception as exc:
            answers = [exc]
    else:
        answers = await asyncio.gather(
            *(reader.read_claim(ref.namespace, ref.name) for ref in wanted),
            return_exceptions=True,
        )
    if wanted:
        log.debug(
            "read %d claim(s) in %.1f ms", len(wanted), (time.perf_counter() - started) * 1000
        )
    return {ref.uid: answer for ref, answer in zip(wanted, answers, strict=True)}
