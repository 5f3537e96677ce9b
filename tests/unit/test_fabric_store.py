"""The fabric's SQLite store and topology loading, without HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.errors import ConfigError
from fabric.service import inventory
from fabric.service.demo import demo_spec, write_demo
from fabric.service.store import Store


def test_store_round_trip_survives_reopen(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    s = Store(db)
    conn, task = s.start_attach("gpu-0", "node-a-adapter0", fail=True)
    s.set_connection(conn.id, bdf="0000:17:00.0")
    s.set_device("gpu-1", health="Critical", in_use=True)
    s.set_knob("fail_attaches", 2)
    s.close()
    s = Store(db)
    got = s.connection_of("gpu-0")
    assert got is not None and (got.state, got.bdf) == ("Attaching", "0000:17:00.0")
    assert [t.id for t in s.open_tasks()] == [task.id] and s.task(task.id).fail  # type: ignore[union-attr]
    assert s.device("gpu-1").health == "Critical" and s.device("gpu-1").in_use
    assert s.take("fail_attaches") and s.take("fail_attaches") and not s.take("fail_attaches")
    s.set_task(task.id, "Completed")
    assert s.open_tasks() == [] and s.task(task.id).ended is not None  # type: ignore[union-attr]
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_one_connection_per_device(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    s.start_attach("gpu-0", "a", fail=False)
    with pytest.raises(Exception, match="UNIQUE"):
        s.start_attach("gpu-0", "b", fail=False)


def test_demo_inventory(tmp_path: Path) -> None:
    inv = inventory.load(write_demo(tmp_path))
    assert inv.fabrics == {"pcie0": "PCIe"}
    assert len(inv.switches) == 2 and len(inv.initiators) == 5 and len(inv.targets) == 5
    assert {i.node for i in inv.initiators.values()} == {"node-a", "node-b", "node-c"}
    assert inv.initiators["node-a-adapter0"].host_dir == tmp_path / "node-a"
    assert inv.targets["nic-0"].num_vfs == 4


def test_topology_errors_name_the_problem(tmp_path: Path) -> None:
    spec = demo_spec()
    spec["fabrics"][0]["switches"][1]["slots"][0]["device"]["id"] = "gpu-0"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="gpu-0"):
        inventory.load(path)
    spec = demo_spec()
    spec["fabrics"][0]["switches"][0]["slots"][0]["device"]["model"] = "Z9000"
    path.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="unknown GPU model"):
        inventory.load(path)
