"""``Idempotency-Key`` on the attach requests: a repeat answers the first answer.

Why: a client that crashes between sending ``POST .../Connections`` (or a
Zone ``PATCH``) and reading the answer cannot know whether the fabric acted.
Sending the request again with the same ``Idempotency-Key`` header is safe
here: the service answers the first answer (status, ``Location``, body) and
does not act, or count an attach request, a second time. This is NOT a
Redfish standard (DSP0266 has no such header; it follows the IETF
``draft-ietf-httpapi-idempotency-key-header``); real fabric managers offer
nothing of the kind, see docs/fabric.md.

Rules: the key is scoped to method and path; the answer is kept in the
store (it survives a restart of the service); a reuse of the key with a
different body is refused with 422; 5xx answers are not kept (a retry runs
again). Requests with a key run one at a time (one lock), so two racing
repeats cannot both act.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from fabric.service.errors import RedfishError
from fabric.service.store import Answer, Store

HEADER = "Idempotency-Key"
MAX_KEY = 255

Run = Callable[[], Awaitable[web.Response]]
Call = Callable[..., Awaitable[object]]


class Idempotency:
    def __init__(self, store: Store, call: Call) -> None:
        self._store = store
        self._call = call  # runs a store method on the service's worker thread
        self._lock = asyncio.Lock()

    async def once(self, request: web.Request, run: Run) -> web.Response:
        """``run()``'s answer, or the answer remembered for this request's key."""
        key = request.headers.get(HEADER)
        if key is None:
            return await run()
        if not key or len(key) > MAX_KEY or not key.isprintable():
            raise RedfishError(
                400, "PropertyValueFormatError",
                f"header {HEADER}: 1 to {MAX_KEY} printable characters expected",
            )  # fmt: skip
        scope = f"{request.method} {request.path} {key}"
        digest = hashlib.sha256(await request.read()).hexdigest()
        async with self._lock:
            prior = await self._call(self._store.answer, scope)
            if isinstance(prior, Answer):
                if prior.digest != digest:
                    raise RedfishError(
                        422, "ActionParameterValueConflict",
                        f"header {HEADER}: {key!r} was used with a different request body",
                    )  # fmt: skip
                return _replay(prior)
            try:
                resp = await run()
            except RedfishError as err:
                if err.status < 500:
                    body = json.dumps(err.body())
                    await self._call(self._remember, scope, Answer(digest, err.status, "", body))
                raise
            location = resp.headers.get("Location", "")
            body = resp.text or ""
            await self._call(self._remember, scope, Answer(digest, resp.status, location, body))
            return resp

    def _remember(self, scope: str, answer: Answer) -> None:
        self._store.remember_answer(scope, answer)


def _replay(prior: Answer) -> web.Response:
    headers = {"OData-Version": "4.0", "Content-Type": "application/json"}
    if prior.location:
        headers["Location"] = prior.location
    return web.Response(status=prior.status, text=prior.body or None, headers=headers)
