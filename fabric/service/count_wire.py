"""The count face's wire shapes: request bodies, its error body and its URIs.

Why a module: the simulator serves a third face of the same fabric, the
count-based API of managers that take "N devices of model X to machine M"
and pick the devices themselves. Its shape follows Fujitsu's fabric manager
API as CoHDI's composable-resource-operator drives it: ``PATCH
/fabric_manager/api/v1/machines/{mach_uuid}/update`` scales a machine up
(``res_specs`` naming a type, a ``model eq`` condition and ``res_num``) and
answers at once with the added resources (``res_uuid``, ``res_serial_num``);
``DELETE`` of the same path scales down by ``res_uuid``; ``GET
.../machines/{mach_uuid}`` lists a machine's resources; every call carries
``tenant_uuid`` as a query parameter. Errors are ``{"status": N, "detail":
{"code", "message", "data"}}``, not Redfish bodies. This module is the trust
boundary: bodies are parsed with pydantic and a bad one is a 400 naming the
field. The URIs of this face are spelled here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fabric.service.errors import RedfishError

FM = "/fabric_manager/api/v1"
MACHINES = f"{FM}/machines"
TOKEN = "/id_manager/realms/{realm}/protocol/openid-connect/token"
FAULTS = "/patchbay/v1/count-faults"  # test-only, under the Redfish face's auth
# Paths that authenticate themselves (OAuth2 access tokens), not as the Redfish face does.
OWN_AUTH = ("/fabric_manager/", "/id_manager/")
# Whether a bearer token is an access token the count face issued (the Redfish face takes
# them too: one manager, one identity). Set by count_api.add_routes.
ISSUED: web.AppKey[Callable[[str], bool]] = web.AppKey("count_issued")
M = TypeVar("M", bound=BaseModel)


class FmError(RedfishError):
    """A refusal of the count face, rendered as its error body (not Redfish's)."""

    def __init__(self, status: int, code: str, text: str) -> None:
        super().__init__(status, code, text)

    def body(self) -> dict[str, Any]:
        return {"status": self.status, "detail": {"code": self.message_id, "message": self.text}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(_Body):
    column: str
    operator: str
    value: str


class Spec(_Body):
    condition: list[Condition]


class UpSpec(_Body):
    res_type: str = Field(min_length=1)
    res_spec: Spec
    res_num: int = Field(ge=1, le=16)


class DownSpec(_Body):
    res_type: str = Field(min_length=1)
    res_uuid: str = Field(min_length=1)
    res_num: int = Field(default=1, ge=1, le=1)


class UpResources(_Body):
    res_specs: Annotated[list[UpSpec], Field(min_length=1)]


class DownResources(_Body):
    res_specs: Annotated[list[DownSpec], Field(min_length=1)]


class UpMachine(_Body):
    mach_uuid: str
    resources: Annotated[list[UpResources], Field(min_length=1)]


class DownMachine(_Body):
    mach_uuid: str
    resources: Annotated[list[DownResources], Field(min_length=1)]


class UpTenants(_Body):
    tenant_uuid: str
    machines: Annotated[list[UpMachine], Field(min_length=1, max_length=1)]


class DownTenants(_Body):
    tenant_uuid: str
    machines: Annotated[list[DownMachine], Field(min_length=1, max_length=1)]


class ScaleUp(_Body):
    tenants: UpTenants


class ScaleDown(_Body):
    tenants: DownTenants


class CountFaults(_Body):
    """Test-only knobs: the next N scale-ups attach another model, or nothing."""

    wrong_model_next: int | None = Field(default=None, ge=0, alias="wrongModelNext")
    nothing_next: int | None = Field(default=None, ge=0, alias="nothingNext")


def parse(model: type[M], raw: bytes) -> M:
    """``model`` from a JSON body, or a 400 whose message names the first bad field."""
    try:
        return model.model_validate(json.loads(raw or b"null"))
    except json.JSONDecodeError as exc:
        raise FmError(400, "E40000", f"body is not JSON: {exc.msg}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise FmError(400, "E40001", f"{field}: {err['msg']}") from exc


def model_of(spec: UpSpec) -> str:
    """The model a scale-up asks for: its one ``model eq`` condition."""
    models = [c.value for c in spec.res_spec.condition if (c.column, c.operator) == ("model", "eq")]
    others = [c.column for c in spec.res_spec.condition if c.column != "model"]
    if others or len(models) != 1:
        raise FmError(
            400, "E40002",
            "res_spec.condition: exactly one {column: model, operator: eq} is served",
        )  # fmt: skip
    return models[0]


def condition(model: str) -> dict[str, list[dict[str, str]]]:
    return {"condition": [{"column": "model", "operator": "eq", "value": model}]}
