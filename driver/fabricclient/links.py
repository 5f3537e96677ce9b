"""Following Redfish links during one read of the fabric: each URI fetched once.

Why a module: the standard spreads one device over several resources (an
Endpoint links a Processor, which links a PCIeDevice, whose function holds
the PCI ids), and one listing reaches the same resource from many places
(a switch port from every endpoint behind it, a system from each of its
adapters). A :class:`Links` lives for one read: it fetches a URI at most
once (concurrent readers share the one request) and forgets everything
afterwards, so the next read sees fresh state.

Collections are inlined with ``$expand`` only when the service root says
the service offers it (``ProtocolFeaturesSupported.ExpandQuery``); else, or
when the service answers an expanded request with bare links anyway, the
members are fetched one by one (concurrently). A service that refuses the
query it advertised (400, 405, 501) is not asked again: the shared
:class:`Capabilities` forget it for the client's later reads.

One broken resource must not cost the whole read: :meth:`Links.members`
and :meth:`Links.maybe` in ``tolerant`` use record a resource that answers
an error (other than the ones about the whole service: 401, 403, 429, 503),
is missing where a link names it, is malformed, cut short or too large, in
:attr:`Links.broken` (logged with its URI, counted by cause) and go on
without it; the reader then holds back what depends on it. A manager that
cannot be reached still fails the read (:class:`FabricUnreachable`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from driver.errors import (
    FabricApiError,
    FabricMalformed,
    FabricNotFound,
    FabricResourceBroken,
    PatchbayError,
)
from driver.fabricclient import wire
from driver.fabricclient.transport import Transport
from driver.metrics import FABRIC_UNREADABLE

log = logging.getLogger(__name__)
REFUSED = {400, 405, 501}  # a query the service does not do after all
WHOLE_SERVICE = {401, 403, 429, 503}  # answers about the service, not one resource


def cause_of(exc: PatchbayError) -> str | None:
    """Why one resource is unreadable (a metric label), or None when the error is
    about the whole service (or the manager is unreachable): not tolerated."""
    if isinstance(exc, FabricMalformed):
        return "malformed"
    if isinstance(exc, FabricResourceBroken):
        return "unreadable"  # too large, cut short
    if isinstance(exc, FabricNotFound):
        return "missing"
    if isinstance(exc, FabricApiError) and exc.status not in WHOLE_SERVICE:
        return "error_answer"
    return None


@dataclass
class Capabilities:
    """What the service offers, as far as the client has learnt (one per client)."""

    expand: str = ""  # "." or "*": the $expand that inlines members; "": none
    types: dict[str, str] = field(default_factory=dict)  # schema -> @odata.type to POST


def parse(model: type[wire.M], data: Any, where: str) -> wire.M:
    """``data`` as ``model``, or :class:`FabricMalformed` naming ``where``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        wrong = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise FabricMalformed(
            f"fabric GET {where}: expected a Redfish {model.__name__} body: {wrong}", where
        ) from exc


class Links:
    """One read's cache of fetched resources (see the module docstring)."""

    def __init__(self, transport: Transport, caps: Capabilities | None = None) -> None:
        self.transport = transport
        self.caps = caps or Capabilities()
        self._got: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.broken: dict[str, str] = {}  # URI -> why it could not be read (tolerant reads)

    def note_broken(self, uri: str, exc: PatchbayError) -> bool:
        """Record ``uri`` as unreadable when ``exc`` is about it alone (True)."""
        cause = cause_of(exc)
        if cause is None:
            return False
        if uri not in self.broken:
            self.broken[uri] = str(exc)
            FABRIC_UNREADABLE.labels(cause).inc()
            log.warning("fabric resource %s unreadable (%s): %s", uri, cause, exc)
        return True

    async def maybe(
        self, model: type[wire.M], uri: str, where: str = "", gone_ok: bool = False
    ) -> wire.M | None:
        """:meth:`model`, or None (recorded in :attr:`broken`) when that resource
        alone is broken; ``gone_ok``: None, unrecorded, when it is not found (a link
        that outlived what it names: a backlink no collection confirms)."""
        try:
            return await self.model(model, uri, "" if gone_ok else where)
        except (FabricApiError, FabricResourceBroken) as exc:
            if gone_ok and isinstance(exc, FabricNotFound):
                log.info("fabric %s, linked from %s, is gone: ignored", uri, where or "?")
                return None
            if not self.note_broken(uri, exc):
                raise
            return None

    async def get(self, uri: str) -> dict[str, Any]:
        uri = uri.rstrip("/") or uri
        fut = self._got.get(uri)
        if fut is None:
            fut = self._got[uri] = asyncio.ensure_future(self.transport.get(uri))
        return await asyncio.shield(fut)

    async def model(self, model: type[wire.M], uri: str, where: str = "") -> wire.M:
        """Resource ``uri`` as ``model``; linked from ``where``: a link to nothing is
        the fabric's inconsistency (:class:`FabricMalformed`), not a 404 to the caller."""
        try:
            return parse(model, await self.get(uri), uri)
        except FabricNotFound as exc:
            if not where:
                raise
            raise FabricMalformed(
                f"fabric GET {uri}: 404, expected the resource {where} links", uri
            ) from exc

    async def collection(self, owner: str, name: str, linked: str) -> str:
        """The URI of ``owner``'s collection ``name`` that answers: ``linked``, else
        (recorded broken, or not linked) the standard ``<owner>/<name>`` that the
        schemas' URI patterns give (Sunfish links ``/redfish/v1/Endpoints`` where
        ``/redfish/v1/Fabrics/CXL/Endpoints`` is served); "" when it is not linked
        and not there. A link to it that neither answers is
        :class:`FabricResourceBroken` naming both: what it holds cannot be known."""
        standard = f"{owner.rstrip('/')}/{name}"
        if linked:
            try:
                await self.get(linked)
                return linked
            except (FabricApiError, FabricResourceBroken) as exc:
                if not self.note_broken(linked, exc):
                    raise
        try:
            await self.get(standard)
        except (FabricApiError, FabricResourceBroken) as exc:
            if not linked and isinstance(exc, FabricNotFound):
                return ""  # the service has none
            if cause_of(exc) is None:
                raise
            raise FabricResourceBroken(
                f"fabric {owner}: its {name} collection is unreadable at {linked or standard}"
                f"{f' and at {standard}' if linked and linked != standard else ''}: {exc}",
                linked or standard,
            ) from exc
        if linked:
            log.warning("fabric %s links its %s at %s, which is broken: reading %s",
                        owner, name, linked, standard)  # fmt: skip
        return standard

    async def members(self, uri: str, tolerant: bool = False) -> list[dict[str, Any]]:
        """The members of collection ``uri``, each a full resource body; ``tolerant``:
        without those that cannot be read (recorded in :attr:`broken`)."""
        body = None
        if self.caps.expand:
            try:
                body = await self.get(f"{uri}?$expand={self.caps.expand}")
            except FabricApiError as exc:
                if exc.status not in REFUSED:
                    raise
                log.info("fabric refused $expand on %s (%s): members one by one", uri, exc)
                self.caps.expand = ""
            except FabricResourceBroken as exc:  # too large, cut short: one by one, this once
                log.info("fabric %s expanded unreadable (%s): members one by one", uri, exc)
        if body is None:
            body = await self.get(uri)
        listed = parse(wire.Collection, body, uri).members
        if not tolerant:
            return list(await asyncio.gather(*(self._full(m, uri) for m in listed)))
        got = await asyncio.gather(*(self._full(m, uri) for m in listed), return_exceptions=True)
        out = []
        for member, item in zip(listed, got, strict=True):
            if isinstance(item, (FabricApiError, FabricResourceBroken)):
                if not self.note_broken(str(member.get("@odata.id", uri)), item):
                    raise item
            elif isinstance(item, BaseException):
                raise item
            else:
                out.append(item)
        return out

    async def _full(self, member: dict[str, Any], where: str) -> dict[str, Any]:
        ident = member.get("@odata.id")
        if not isinstance(ident, str):
            raise FabricMalformed(
                f"fabric GET {where}: expected every member to have an @odata.id", where
            )
        if set(member) <= {"@odata.id", "@odata.type", "@odata.etag"}:  # a bare link
            try:
                return await self.get(ident)
            except FabricNotFound as exc:
                raise FabricMalformed(
                    f"fabric GET {ident}: 404, expected the member collection {where} lists",
                    ident,
                ) from exc
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        fut.set_result(member)
        self._got.setdefault(ident.rstrip("/"), fut)
        return member

    async def first_member(self, uri: str) -> dict[str, Any] | None:
        """The first member of collection ``uri`` (a device's function 0), or None."""
        listed = parse(wire.Collection, await self.get(uri), uri).members
        if not listed or not isinstance(listed[0].get("@odata.id"), str):
            return None
        return await self.get(listed[0]["@odata.id"])
