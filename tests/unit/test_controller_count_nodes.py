"""The controller hands a count dialect each Node's machine id from the Node's label
or annotation (``fabric_machine_key``); the static ``fabric_machines`` wins."""

from __future__ import annotations

import pytest

from driver.controller.count_nodes import learn_machines
from driver.errors import FabricNotFound
from driver.fabricclient.dialect_count import CountDialect, Machines

KEY = "example.com/machine"


class Client:
    def __init__(self, dialect: object) -> None:
        self.dialect = dialect


def node(name: str, labels: dict[str, str] | None = None, notes: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": notes or {}}}


def test_machines_come_from_the_nodes_label_or_annotation() -> None:
    dialect = CountDialect(Machines({"static": "m0"}, KEY), "tenant")
    with pytest.raises(FabricNotFound, match=f"node a: no machine id .*{KEY}"):
        dialect.machines.of("a")
    nodes = [node("a", {KEY: "m1"}), node("b", notes={KEY: "m2"}), node("static", {KEY: "mX"})]
    learn_machines(Client(dialect), nodes)
    assert [dialect.machines.of(n) for n in ("a", "b", "static")] == ["m1", "m2", "m0"]
    learn_machines(Client(dialect), [node("b", notes={KEY: "m2"})])  # a's label went
    with pytest.raises(FabricNotFound):
        dialect.machines.of("a")


def test_other_dialects_are_left_alone() -> None:
    learn_machines(Client("connections"), [node("a", {KEY: "m1"})])
    learn_machines(object(), [node("a", {KEY: "m1"})])
