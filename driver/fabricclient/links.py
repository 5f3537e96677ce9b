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
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from driver.errors import FabricApiError, FabricMalformed, FabricNotFound
from driver.fabricclient import wire
from driver.fabricclient.transport import Transport

log = logging.getLogger(__name__)
REFUSED = {400, 405, 501}  # a query the service does not do after all


@dataclass
class Capabilities:
    """What the service offers, as far as the client has learnt (one per client)."""

    expand: str = ""  # "." or "*": the $expand that inlines members; "": none


def parse(model: type[wire.M], data: Any, where: str) -> wire.M:
    """``data`` as ``model``, or :class:`FabricMalformed` naming ``where``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FabricMalformed(f"fabric answered an unexpected body for {where}: {exc}") from exc


class Links:
    """One read's cache of fetched resources (see the module docstring)."""

    def __init__(self, transport: Transport, caps: Capabilities | None = None) -> None:
        self.transport = transport
        self.caps = caps or Capabilities()
        self._got: dict[str, asyncio.Future[dict[str, Any]]] = {}

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
                f"fabric resource {where} links {uri}, which is not found"
            ) from exc

    async def members(self, uri: str) -> list[dict[str, Any]]:
        """The members of collection ``uri``, each a full resource body."""
        body = None
        if self.caps.expand:
            try:
                body = await self.get(f"{uri}?$expand={self.caps.expand}")
            except FabricApiError as exc:
                if exc.status not in REFUSED:
                    raise
                log.info("fabric refused $expand on %s (%s): members one by one", uri, exc)
                self.caps.expand = ""
        if body is None:
            body = await self.get(uri)
        listed = parse(wire.Collection, body, uri).members
        return list(await asyncio.gather(*(self._full(m, uri) for m in listed)))

    async def _full(self, member: dict[str, Any], where: str) -> dict[str, Any]:
        ident = member.get("@odata.id")
        if not isinstance(ident, str):
            raise FabricMalformed(f"fabric answered a member without @odata.id in {where}")
        if set(member) <= {"@odata.id", "@odata.type", "@odata.etag"}:  # a bare link
            try:
                return await self.get(ident)
            except FabricNotFound as exc:
                raise FabricMalformed(
                    f"fabric collection {where} lists {ident}, not found"
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
