"""How many devices each host adapter can take: its virtual switch's vPPBs.

Why a module: a host's port into a fabric switch can bind only so many
devices, and the controller keeps that room (driver/controller/pool/room.py).
Redfish says it in one standard place: a switch's ``CXL.VirtualCXLSwitches``
holds a Virtual CXL Switch (VCS) per host upstream port, whose
``Links.Endpoints`` and ``Links.Port`` (the upstream port, through its
``AssociatedEndpoints``) name the host's initiator endpoints (DMTF's
mockup names the switch's own endpoint in the first and the host's three
in the second), and each device the host takes is bound to one
of the VCS's vPPBs: the count of its ``VPPBs`` collection is the room
(DMTF's public-cxl mockup: VCS 1 on port U1, three vPPBs, shared by the
initiators I1-I3 of the one CPU port; it lists I1 on U2 and U3 too, whose
VCSs have two vPPBs: an endpoint that several VCSs name gets no room, as
the fabric does not say which holds). A fabric
that serves none limits nothing (room 0). Tolerant: a VCS or vPPB
collection that cannot be read is recorded broken and its host gets no
room, as if unlimited; the rest is read.
"""

from __future__ import annotations

import logging

from driver.errors import FabricApiError, FabricMalformed, FabricResourceBroken
from driver.fabricclient import wire
from driver.fabricclient.attachment import key
from driver.fabricclient.links import Links, parse
from driver.fabricclient.reach import Graph

log = logging.getLogger(__name__)


async def read_rooms(links: Links, graph: Graph) -> dict[str, tuple[int, str]]:
    """Endpoint URI -> (how many devices it can take, the VCS's URI), for the
    endpoints a VCS names or its upstream port lists (every host endpoint
    bound to one VCS shares its room)."""
    named: dict[str, list[tuple[int, str]]] = {}
    for uri in graph.vcss:
        try:
            bodies = await links.members(uri, tolerant=True)
        except (FabricApiError, FabricResourceBroken) as exc:
            if not links.note_broken(uri, exc):
                raise
            continue
        for body in bodies:
            where = str(body.get("@odata.id", uri))
            try:
                vcs = parse(wire.VirtualCxlSwitch, body, where)
                if vcs.vppbs is None:
                    continue
                listed = await links.get(vcs.vppbs.odata_id)
                room = len(parse(wire.Collection, listed, vcs.vppbs.odata_id).members)
            except (FabricApiError, FabricResourceBroken, FabricMalformed) as exc:
                if not links.note_broken(where, exc):
                    raise
                continue
            hosts = [key(e.odata_id) for e in vcs.links.endpoints]
            if vcs.links.port is not None:
                hosts += graph.ends.get(key(vcs.links.port.odata_id), [])
            for host in dict.fromkeys(hosts):
                named.setdefault(host, []).append((room, key(vcs.odata_id)))
    # One VCS names it: that room. Several (a host on several upstream ports,
    # or a model that says it loosely): which limit holds is not known, so none.
    out = {host: vcss[0] for host, vcss in named.items() if len(vcss) == 1}
    if out:
        log.debug("fabric adapter room: %s", out)
    return out
