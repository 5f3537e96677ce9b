"""The server side of Redfish sessions, for the fabric client's tests.

Why a module: the authentication tests and the hostile-manager tests both
serve sessions (POST logs in, DELETE logs out, a token checked on every
request) from one local server.
"""

from __future__ import annotations

from aiohttp import web

from tests.unit.fabric_standard_server import ROOT, Handler, MockupServer, contract_tree

SESSIONS = f"{ROOT}/SessionService/Sessions"


class Sessions:
    """The server side of Redfish sessions: POST logs in, DELETE logs out."""

    def __init__(self, password: str = "s3cret") -> None:
        self.password, self.valid, self.logins, self.logouts = password, set[str](), 0, 0

    async def login(self, request: web.Request) -> web.Response:
        body = await request.json()
        if (body.get("UserName"), body.get("Password")) != ("admin", self.password):
            return web.json_response({"error": {"code": "Base.NoValidSession"}}, status=401)
        self.logins += 1
        token = f"tok{self.logins}"
        self.valid.add(token)
        headers = {"X-Auth-Token": token, "Location": f"{SESSIONS}/{self.logins}"}
        return web.json_response({"Id": str(self.logins)}, status=201, headers=headers)

    async def logout(self, request: web.Request) -> web.Response:
        self.logouts += 1
        self.valid.discard(request.headers.get("X-Auth-Token", ""))
        return web.Response(status=204)

    def server(self) -> MockupServer:
        routes: dict[tuple[str, str], Handler] = {("POST", SESSIONS): self.login}
        routes |= {("DELETE", f"{SESSIONS}/{n}"): self.logout for n in (1, 2)}
        valid = self.valid
        return MockupServer(
            bodies=contract_tree(),
            routes=routes,
            auth=lambda r: r.headers.get("X-Auth-Token") in valid,
        )
