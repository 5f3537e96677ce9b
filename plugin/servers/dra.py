"""The kubelet's DRA service (``DRAPlugin``), served under v1 and v1beta1.

One :class:`DraServicer` instance per proto version, both sharing the same
:class:`~driver.claims.model.ClaimHandler`, whose one claim lock
(``driver.claims.lock``) serialises a call through either version with calls
through the other (and, with rolling update, with the other plugin pod). The servicer only
translates and isolates failures: an exception from the handler fails every
claim of that batch with the exception's message, never the RPC, because the
kubelet ignores the whole response of a failed RPC and retries all claims.

Each call is logged once at info, when it is over: the claims, how many
failed and the call's time, written after the answer has left (``loop.call_soon``
from the servicer: the server writes the answer in the same step of the
call's task). A line costs a prepare 50-70 us on a node, 5-10 % of its own
work; the kubelet does not wait for it. A claim's failure is logged at
once, and at debug a line marks each call's start (a call that hangs shows
in the log by its start line).

Concurrency model: coroutine methods on the server's asyncio loop; the handler
is awaited directly and is responsible for pushing blocking work to threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from driver.claims.model import ClaimHandler, ClaimRef, PrepareResult
from plugin.proto import dra_v1_pb2, dra_v1beta1_pb2
from plugin.servers import translate
from plugin.servers.unix_server import UnixGrpcServer

log = logging.getLogger(__name__)

# (version prefix advertised in GetInfo, messages module)
VERSIONS: tuple[tuple[str, ModuleType], ...] = (("v1", dra_v1_pb2), ("v1beta1", dra_v1beta1_pb2))


class DraServicer:
    """Implements ``DRAPlugin`` for one proto version (the ``pb2`` module)."""

    def __init__(self, handler: ClaimHandler, pb2: ModuleType) -> None:
        self._handler = handler
        self._pb2 = pb2
        # Taken at the first call: a loop lookup reads the process id on 3.11.
        self._loop: asyncio.AbstractEventLoop | None = None

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        claims = translate.claims_from_proto(request.claims)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("prepare %d claim(s): %s", len(claims), [c.uid for c in claims])
        try:
            # The API reads first, outside the claim lock: a read that hangs
            # (the apiserver or etcd down) never holds up an unprepare.
            fetched = await self._handler.read(claims)
            results = await self._handler.prepare(claims, fetched)
        except Exception as exc:
            log.exception("prepare failed for the whole batch")
            errors = translate.batch_failure(claims, exc)
            results = {uid: PrepareResult(error=msg) for uid, msg in errors.items()}
        for uid, result in results.items():
            if result.error:
                log.warning("prepare of claim %s failed: %s", uid, result.error)
        self._log_after_answer(
            "prepared", claims, {u: r.error for u, r in results.items()}, started
        )
        return translate.prepare_response(self._pb2, claims, results)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        claims = translate.claims_from_proto(request.claims)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("unprepare %d claim(s): %s", len(claims), [c.uid for c in claims])
        try:
            errors = await self._handler.unprepare(claims)
        except Exception as exc:
            log.exception("unprepare failed for the whole batch")
            errors = translate.batch_failure(claims, exc)
        for uid, error in errors.items():
            if error:
                log.warning("unprepare of claim %s failed: %s", uid, error)
        self._log_after_answer("unprepared", claims, errors, started)
        return translate.unprepare_response(self._pb2, claims, errors)

    def _log_after_answer(
        self, done: str, claims: list[ClaimRef], errors: Mapping[str, str], started: float
    ) -> None:
        """The call's info line, once the answer is written (module docstring)."""
        if not log.isEnabledFor(logging.INFO):
            return
        ms = (time.perf_counter() - started) * 1000
        failed = sum(1 for c in claims if errors.get(c.uid, translate.MISSING_RESULT))
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._loop.call_soon(
            log.info, "%s %d claim(s) in %.2f ms, %d failed: %s",
            done, len(claims), ms, failed, [c.uid for c in claims],
        )  # fmt: skip


def add_dra_servicers(server: UnixGrpcServer, handler: ClaimHandler) -> list[str]:
    """Register the DRA service under every version on ``server``; returns
    the advertised names, e.g. ``"v1.DRAPlugin"``."""
    names = []
    for prefix, pb2 in VERSIONS:
        server.add_service(pb2.DESCRIPTOR.services_by_name["DRAPlugin"], DraServicer(handler, pb2))
        names.append(f"{prefix}.DRAPlugin")
    return names
