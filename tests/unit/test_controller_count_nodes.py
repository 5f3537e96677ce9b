"""The controller hands the fabric client the Nodes on each pass, and a count
dialect reads each Node's machine id off its label or annotation
(``fabric_machine_key``); the static ``fabric_machines`` wins; without the
key no label is read."""

from __future__ import annotations

from typing import Any

import pytest

from driver.errors import FabricNotFound
from driver.fabricclient.client import FabricClient
from driver.fabricclient.dialect_count import CountDialect, Machines

KEY = "example.com/machine"


def node(
    name: str, labels: dict[str, str] | None = None, notes: dict[str, str] | None = None
) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": notes or {}}}


async def test_machines_come_from_the_nodes_label_or_annotation() -> None:
    dialect = CountDialect(Machines({"static": "m0"}, KEY), "tenant")
    client = FabricClient("http://fm.example", "token", dialect=dialect)
    try:
        with pytest.raises(FabricNotFound, match=f"node a: no machine id .*{KEY}"):
            dialect.machines.of("a")
        nodes = [node("a", {KEY: "m1"}), node("b", notes={KEY: "m2"}), node("static", {KEY: "mX"})]
        client.set_nodes(nodes)
        assert [dialect.machines.of(n) for n in ("a", "b", "static")] == ["m1", "m2", "m0"]
        client.set_nodes([node("b", notes={KEY: "m2"})])  # a's label went
        with pytest.raises(FabricNotFound):
            dialect.machines.of("a")
    finally:
        await client.close()


async def test_without_the_key_no_label_is_read() -> None:
    dialect = CountDialect(Machines({"static": "m0"}), "tenant")
    client = FabricClient("http://fm.example", "token", dialect=dialect)
    try:
        client.set_nodes([node("a", {KEY: "m1"}), node("static", {KEY: "mX"})])
        assert dialect.machines.of("static") == "m0"
        with pytest.raises(FabricNotFound, match=r"node a: no machine id .*no fabric_machine_key"):
            dialect.machines.of("a")
    finally:
        await client.close()
