"""Redfish sessions: ``POST .../SessionService/Sessions`` logs in, ``DELETE`` logs out.

Why: DSP0266 clients (and DMTF's validators) log in with a session, or use
HTTP Basic, rather than a bearer token. A session is created from the user
name and password (the service's one user, :data:`USER`, whose password is
the service's token: one secret, rotated with the token file); its
``X-Auth-Token`` is then accepted until it is deleted or idle for
:data:`TIMEOUT_S`. Sessions live in memory: a restarted service forgets
them and clients log in again (a 401 tells them).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from fabric.service import uris
from fabric.service.uris import Json, link

USER = "patchbay"
TIMEOUT_S = 1800


@dataclass
class Session:
    id: str
    user: str
    token: str
    created: float
    seen: float = field(default_factory=time.monotonic)


class Sessions:
    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}
        self._next = 1

    def create(self, user: str) -> Session:
        ident = str(self._next)
        self._next += 1
        session = Session(ident, user, secrets.token_urlsafe(32), time.time())
        self._by_id[ident] = session
        return session

    def _expire(self) -> None:
        now = time.monotonic()
        for ident in [i for i, s in self._by_id.items() if now - s.seen > TIMEOUT_S]:
            del self._by_id[ident]

    def check(self, token: str) -> Session | None:
        """The live session whose token this is (and mark it used), else None."""
        self._expire()
        for s in self._by_id.values():
            if hmac.compare_digest(s.token.encode(), token.encode()):
                s.seen = time.monotonic()
                return s
        return None

    def get(self, ident: str) -> Session | None:
        self._expire()
        return self._by_id.get(ident)

    def delete(self, ident: str) -> bool:
        return self._by_id.pop(ident, None) is not None

    def ids(self) -> list[str]:
        self._expire()
        return sorted(self._by_id, key=int)


def service() -> Json:
    return {
        "@odata.id": uris.SESSION_SERVICE,
        "@odata.type": "#SessionService.v1_2_0.SessionService",
        "Id": "SessionService",
        "Name": "Session Service",
        "ServiceEnabled": True,
        "SessionTimeout": TIMEOUT_S,
        "Status": {"State": "Enabled", "Health": "OK"},
        "Sessions": link(uris.SESSIONS),
    }


def body(s: Session) -> Json:
    return {
        "@odata.id": uris.session_uri(s.id),
        "@odata.type": "#Session.v1_8_0.Session",
        "Id": s.id,
        "Name": f"session {s.id}",
        "UserName": s.user,
        "SessionType": "Redfish",
        "CreatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s.created)),
    }
