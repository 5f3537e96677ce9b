"""The ``count`` dialect: managers that take "one device of model X to machine M".

Why a module: some fabric managers do not let the client choose the device.
Fujitsu's fabric manager (the one CoHDI's composable-resource-operator
drives) scales a machine up by type and model: ``PATCH
/fabric_manager/api/v1/machines/{mach_uuid}/update?tenant_uuid=T`` with
``res_specs: [{res_type, res_spec: {condition: [{column: model, operator:
eq, value}]}, res_num: 1}]`` answers at once with the resources it added,
each named only by the manager's own identity (``res_uuid``) and a board
serial (``res_serial_num``, not a GPU UUID). Scale-down is ``DELETE`` of the
same path naming ``res_uuid``; ``GET .../machines/{mach_uuid}`` lists a
machine's resources. Authentication is OAuth2 (``fabric_auth: oauth2``,
``auth.py``) or a bearer token.

An attach asks for one device of the allocated device's type and model on
the node's machine; the answer (:class:`CountAttachResult`) carries what
arrived, which may be another device of that model: the caller maps its
serial to what the node reports. What arrived of another type or model, or
Critical, is scaled down again and the attach fails naming it
(:class:`CountAttachFailed`); nothing arriving fails it too. The
controller publishes model slots for such a fabric and follows whatever
device of the model arrives (``driver.controller.pool.slots``,
``driver.controller.attach.slot_attach``); ``exact`` (off there) fails the same way when the manager
chose another device than the one asked for through, for a caller that
serves only the device it named. The inventory
(what exists, its model and serial) is read from the manager's Redfish
service as for the other dialects, and so are the attachments
(``Connections``); a manager with no Redfish inventory is not served yet.

A node's machine: the setting ``fabric_machines`` (``node=mach_uuid,...``),
else the value of the Node label or annotation ``fabric_machine_key``
(:meth:`Machines.set_nodes`, fed from the Nodes by the controller).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from driver.errors import CountAttachFailed, FabricApiError, FabricMalformed, FabricNotFound
from driver.fabricclient import wire
from driver.fabricclient.attachment import IDEMPOTENCY_HEADER, Binding
from driver.fabricclient.dialect import Dialect, FabricDialectSetting
from driver.fabricclient.dialect_connections import ConnectionsDialect
from driver.fabricclient.links import Links
from driver.fabricclient.model import AttachResult, FabricDevice, FabricTask, HostAdapter
from driver.fabricclient.operations import Operations
from driver.fabricclient.transport import Transport

log = logging.getLogger(__name__)
MACHINES = "/fabric_manager/api/v1/machines"
Health = Literal["OK", "Warning", "Critical", "Unknown"]
HEALTH: dict[str, Health] = {
    "0": "OK",
    "1": "Warning",
    "2": "Critical",
}


@dataclass(frozen=True)
class CountResource:
    """A device as the manager names it."""

    res_uuid: str
    serial: str
    kind: str
    model: str
    health: Health
    name: str = ""

    def describe(self) -> str:
        model = self.model or "(no model)"
        return f"{self.kind} {model} serial {self.serial or '?'} (res_uuid {self.res_uuid})"


@dataclass(frozen=True)
class CountAttachResult(AttachResult):
    """What a scale-up added: ``arrived`` is the device the manager chose."""

    arrived: CountResource | None = None


# ---- the wire (a trust boundary: parsed, unknown fields ignored) ----------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Condition(_Wire):
    column: str = ""
    operator: str = ""
    value: str = ""


class _Spec(_Wire):
    condition: list[_Condition] = []


class _Resource(_Wire):
    res_uuid: str = Field(min_length=1)
    res_name: str = ""
    res_type: str = ""
    res_op_status: str = ""
    res_serial_num: str = ""
    res_spec: _Spec = _Spec()

    def ours(self) -> CountResource:
        model = next(
            (c.value for c in self.res_spec.condition if (c.column, c.operator) == ("model", "eq")),
            "",
        )
        health = HEALTH.get(self.res_op_status[:1], "Unknown")
        return CountResource(
            self.res_uuid, self.res_serial_num, self.res_type, model, health, self.res_name
        )


class _Machine(_Wire):
    mach_uuid: str = ""
    resources: list[_Resource] = []


class _Data(_Wire):
    machines: list[_Machine] = []


class _Answer(_Wire):
    data: _Data


def resources(body: Any, where: str) -> list[CountResource]:
    try:
        answer = _Answer.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise FabricMalformed(f"fabric {where}: {field}: {err['msg']}") from exc
    return [r.ours() for m in answer.data.machines for r in m.resources]


def scale_body(tenant: str, machine: str, spec: dict[str, Any]) -> dict[str, Any]:
    machines = [{"mach_uuid": machine, "resources": [{"res_specs": [spec]}]}]
    return {"tenants": {"tenant_uuid": tenant, "machines": machines}}


# ---- which machine a node is ------------------------------------------------------------


def machine_pairs(text: str) -> dict[str, str]:
    """``node=machine,...`` as node -> machine (ValueError naming a bad or repeated pair)."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        node, sep, machine = (s.strip() for s in pair.partition("="))
        if not sep or not node or not machine or node in out:
            raise ValueError(f"fabric_machines: {pair!r} is not node=machine (or repeats a node)")
        out[node] = machine
    return out


def node_metadata(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Node name -> its labels and annotations (an annotation wins a clash)."""
    out: dict[str, dict[str, str]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta.get("name")
        if name:
            out[str(name)] = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return out


class Machines:
    """Node -> the manager's machine id: the static setting, else the Nodes' key."""

    def __init__(self, static: Mapping[str, str], key: str = "") -> None:
        self.static, self.key = dict(static), key
        self._from_nodes: dict[str, str] = {}

    def set_nodes(self, nodes: Mapping[str, Mapping[str, str]]) -> None:
        """Each Node's labels and annotations (merged): the key's value is its machine."""
        if not self.key:
            return
        found = {n: meta[self.key] for n, meta in nodes.items() if meta.get(self.key)}
        for node in sorted(n for n in found if found[n] != self._from_nodes.get(n)):
            log.info("count fabric: node %s is machine %s (%s)", node, found[node], self.key)
        self._from_nodes = found

    def of(self, node: str) -> str:
        found = self.static.get(node) or self._from_nodes.get(node)
        if not found:
            where = f"Node label/annotation {self.key!r}" if self.key else "no fabric_machine_key"
            raise FabricNotFound(
                404, "MachineUnknown",
                f"node {node}: no machine id (fabric_machines has none, {where})",
            )  # fmt: skip
        return found


# ---- the dialect --------------------------------------------------------------------------


class CountDialect:
    name = "count"
    picks_devices = True  # "one of model X": the manager picks which

    def set_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """Read each Node's machine id off its labels and annotations
        (``fabric_machine_key``), so a Node labelled later is served from the
        next pass on."""
        if self.machines.key:
            self.machines.set_nodes(node_metadata(nodes))

    def __init__(self, machines: Machines, tenant: str, exact: bool = False) -> None:
        self.machines, self.tenant, self.exact = machines, tenant, exact
        self._redfish = ConnectionsDialect()

    def _uri(self, machine: str, tail: str = "") -> str:
        return f"{MACHINES}/{quote(machine, safe='')}{tail}?tenant_uuid={quote(self.tenant)}"

    async def bindings(self, links: Links, fabric: wire.Fabric) -> list[Binding]:
        return await self._redfish.bindings(links, fabric)

    async def named(self, links: Links, eps: list[wire.Endpoint], known: set[str]) -> list[Binding]:
        return await self._redfish.named(links, eps, known)

    async def machine(self, transport: Transport, node: str) -> list[CountResource]:
        """The resources the manager has attached to ``node``'s machine (its "get")."""
        uri = self._uri(self.machines.of(node))
        return resources((await transport.request("GET", uri)).body, f"GET {uri}")

    async def attach(
        self, ops: Operations, links: Links, dev: FabricDevice, via: HostAdapter, key: str
    ) -> AttachResult:
        machine, t = self.machines.of(via.node), links.transport
        cond = {"condition": [{"column": "model", "operator": "eq", "value": dev.model}]}
        spec = {"res_type": dev.kind, "res_spec": cond, "res_num": 1}
        uri = self._uri(machine, "/update")
        resp = await t.request(
            "PATCH", uri, scale_body(self.tenant, machine, spec), {IDEMPOTENCY_HEADER: key}
        )
        arrived = resources(resp.body, f"PATCH {uri}")
        asked = f"one {dev.kind} of model {dev.model} for node {via.node} (machine {machine})"
        if not arrived:
            raise CountAttachFailed(502, "NothingAttached", f"asked {asked}: nothing arrived")
        got = arrived[0]
        wrong = ""
        if (got.kind, got.model) != (dev.kind, dev.model):
            wrong = f"{got.describe()} arrived instead"
        elif got.health == "Critical":
            wrong = f"{got.describe()} arrived Critical"
        elif self.exact and got.serial != dev.serial:
            wrong = (
                f"the manager chose {got.describe()}, not {dev.id} (serial {dev.serial}), "
                "and this controller serves only the allocated device"
            )
        if wrong:
            returned = await self._give_back(t, machine, got)
            raise CountAttachFailed(502, "WrongDevice", f"asked {asked}: {wrong}; {returned}")
        log.info("count attach: %s -> %s", asked, got.describe())
        return CountAttachResult(self._uri(machine) + f"#{got.res_uuid}", None, got)

    async def _give_back(self, t: Transport, machine: str, got: CountResource) -> str:
        try:
            await self._scale_down(t, machine, got)
        except (FabricApiError, FabricMalformed) as exc:
            log.warning("count: scaling %s down again failed: %s", got.res_uuid, exc)
            return f"scaling it down again failed: {exc}"
        return "scaled it down again"

    async def _scale_down(self, t: Transport, machine: str, got: CountResource) -> None:
        spec = {"res_type": got.kind, "res_uuid": got.res_uuid, "res_num": 1}
        await t.request(
            "DELETE", self._uri(machine, "/update"), scale_body(self.tenant, machine, spec)
        )

    async def detach(self, ops: Operations, links: Links, dev: FabricDevice) -> FabricTask | None:
        """Scale down the resource whose serial is ``dev``'s; done when this returns."""
        assert dev.connection is not None
        node = dev.connection.node
        found = [r for r in await self.machine(links.transport, node) if r.serial == dev.serial]
        if not found:
            log.info("count detach %s: machine of %s lists no serial %s", dev.id, node, dev.serial)
            return None
        await self._scale_down(links.transport, self.machines.of(node), found[0])
        log.info("count detach %s (%s) from %s", dev.id, found[0].res_uuid, node)
        return None


class FabricCountSettings(FabricDialectSetting):
    """The dialect setting plus what the ``count`` dialect needs."""

    fabric_count_tenant: str = Field(
        default="", description="count dialect: the manager's tenant_uuid for every request"
    )
    fabric_machines: str = Field(
        default="",
        description="count dialect: nodes' machine ids as 'node=mach_uuid,...' (wins over "
        "fabric_machine_key)",
    )
    fabric_machine_key: str = Field(
        default="",
        description="count dialect: a Node label or annotation whose value is the node's "
        "machine id (mach_uuid)",
    )

    @model_validator(mode="after")
    def _count_complete(self) -> Self:
        machine_pairs(self.fabric_machines)
        if self.fabric_dialect == "count" and not self.fabric_count_tenant:
            raise ValueError("set fabric_count_tenant (fabric_dialect count)")
        if self.fabric_dialect == "count" and not (self.fabric_machines or self.fabric_machine_key):
            raise ValueError("set fabric_machines or fabric_machine_key (fabric_dialect count)")
        return self

    def dialect(self) -> Dialect:
        if self.fabric_dialect != "count":
            return super().dialect()
        machines = Machines(machine_pairs(self.fabric_machines), self.fabric_machine_key)
        return CountDialect(machines, self.fabric_count_tenant)
