"""The AccountService: the service's one account and the three predefined roles.

Why: DSP0266 requires a service to offer the Administrator, Operator and
ReadOnly roles and to list its accounts; clients and DMTF's protocol
validator read them to learn who they are logged in as. The simulated
fabric has one account, :data:`sessions.USER` (password: the service's
token), an Administrator; accounts and roles cannot be changed (no POST,
PATCH or DELETE: 405). Static bodies, served from the map ``services.py``
answers GETs from.
"""

from __future__ import annotations

from fabric.service import sessions, uris
from fabric.service.uris import Json, link

SERVICE = uris.ACCOUNT_SERVICE
ACCOUNTS = f"{SERVICE}/Accounts"
ROLES = f"{SERVICE}/Roles"
PRIVILEGES = {
    "Administrator": ["Login", "ConfigureManager", "ConfigureUsers", "ConfigureSelf",
                      "ConfigureComponents"],
    "Operator": ["Login", "ConfigureSelf", "ConfigureComponents"],
    "ReadOnly": ["Login", "ConfigureSelf"],
}  # fmt: skip


def _collection(uri: str, kind: str, members: list[str]) -> Json:
    return {
        "@odata.id": uri,
        "@odata.type": f"#{kind}Collection.{kind}Collection",
        "Name": f"{kind} Collection",
        "Members@odata.count": len(members),
        "Members": [link(m) for m in members],
    }


def tree() -> dict[str, Json]:
    """The AccountService and everything under it, by URI."""
    account = f"{ACCOUNTS}/1"
    out: dict[str, Json] = {
        SERVICE: {
            "@odata.id": SERVICE,
            "@odata.type": "#AccountService.v1_18_1.AccountService",
            "Id": "AccountService",
            "Name": "Account Service",
            "ServiceEnabled": True,
            "Status": {"State": "Enabled", "Health": "OK"},
            "Accounts": link(ACCOUNTS),
            "Roles": link(ROLES),
        },
        ACCOUNTS: _collection(ACCOUNTS, "ManagerAccount", [account]),
        account: {
            "@odata.id": account,
            "@odata.type": "#ManagerAccount.v1_14_1.ManagerAccount",
            "Id": "1",
            "Name": "patchbay account",
            "UserName": sessions.USER,
            "RoleId": "Administrator",
            "Enabled": True,
            "Locked": False,
            "Password": None,
            "AccountTypes": ["Redfish"],
            "Links": {"Role": link(f"{ROLES}/Administrator")},
        },
        ROLES: _collection(ROLES, "Role", [f"{ROLES}/{r}" for r in PRIVILEGES]),
    }
    for role, privileges in PRIVILEGES.items():
        uri = f"{ROLES}/{role}"
        out[uri] = {
            "@odata.id": uri,
            "@odata.type": "#Role.v1_3_3.Role",
            "Id": role,
            "Name": f"{role} role",
            "RoleId": role,
            "IsPredefined": True,
            "AssignedPrivileges": privileges,
        }
    return out
