"""Log lines carry their context: the JSON formatter writes the claim, pod,
node and device a line is about (process fields, the per-operation context
variable, a call's ``extra``) as fields; the text formatter appends them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver import logconfig
from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.preparer import ClaimPreparer
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from driver.logconfig import JsonFormatter, TextFormatter, bind_log_context, log_context
from driver.node import hotplug
from tests.claims_doubles import NODE, FlakyHandler, Reader


def record(msg: str = "prepared %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.getLogger("driver.test").makeRecord(
        "driver.test", logging.INFO, __file__, 1, msg, args or ("x",), None, extra=extra
    )
    return rec


@pytest.fixture(autouse=True)
def no_process_fields() -> Iterator[None]:
    saved = dict(logconfig._PROCESS)
    logconfig._PROCESS.clear()
    yield
    logconfig._PROCESS.clear()
    logconfig._PROCESS.update(saved)


def test_json_carries_extra_and_context_fields() -> None:
    fmt = JsonFormatter()
    plain = json.loads(fmt.format(record()))
    assert set(plain) == {"ts", "level", "logger", "msg"} and plain["msg"] == "prepared x"
    logconfig.set_process_fields(node="node-a")
    with log_context(claim="ns/c1", pod="ns/p"):
        out = json.loads(fmt.format(record(device="gpu-0")))
    assert {k: out[k] for k in ("claim", "pod", "node", "device")} == {
        "claim": "ns/c1", "pod": "ns/p", "node": "node-a", "device": "gpu-0",
    }  # fmt: skip
    after = json.loads(fmt.format(record()))  # the block ended: its fields with it
    assert "claim" not in after and after["node"] == "node-a"
    odd = json.loads(fmt.format(record(devices=["a", "b"], count=2)))
    assert odd["devices"] == "['a', 'b']" and odd["count"] == 2


def test_text_appends_the_operation_context_only() -> None:
    logconfig.set_process_fields(node="node-a")
    fmt = TextFormatter()
    assert fmt.format(record()).endswith("driver.test: prepared x")
    with log_context(claim="ns/c1"):
        assert fmt.format(record(device="gpu-0")).endswith("prepared x [claim=ns/c1 device=gpu-0]")


async def test_each_task_has_its_own_context_and_threads_inherit_it() -> None:
    fmt = JsonFormatter()

    async def worker(claim: str) -> tuple[str, str]:
        bind_log_context(claim=claim)
        await asyncio.sleep(0)
        in_thread = await asyncio.to_thread(lambda: fmt.format(record()))
        return json.loads(fmt.format(record()))["claim"], json.loads(in_thread)["claim"]

    got = await asyncio.gather(worker("ns/a"), worker("ns/b"))
    assert list(got) == [("ns/a", "ns/a"), ("ns/b", "ns/b")]
    assert "claim" not in json.loads(fmt.format(record()))  # the caller's context untouched


async def test_a_prepare_log_line_carries_its_claim_pod_and_devices(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inv = NodeInventory()
    inv.replace_pool(NODE, [Device("gpu-0", "gpu", "GPU-0", {"minor": 0})])
    reader = Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    handler = FlakyHandler(tmp_path / "dev")
    prep = ClaimPreparer(reader, inv, {"gpu": handler}, store, CdiRegistry(tmp_path / "cdi"))
    ref = reader.add("c1", ["gpu-0"])
    reader.claims[("ns", "c1")]["status"]["reservedFor"] = [{"resource": "pods", "name": "p1"}]
    bad = reader.add("c2", ["gpu-9"])
    with caplog.at_level(logging.DEBUG, logger="driver.claims.preparer"):
        await prep.prepare([ref, bad])
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    ok = next(line for line in lines if line["msg"].startswith("prepared "))
    assert {k: ok[k] for k in ("claim", "claim_uid", "pod", "device")} == {
        "claim": "ns/c1", "claim_uid": ref.uid, "pod": "ns/p1", "device": "gpu-0",
    }  # fmt: skip
    failed = next(line for line in lines if line["level"] == "warning")
    assert failed["claim"] == "ns/c2" and "device" not in failed


async def test_a_hot_plug_rescan_logs_with_the_devices_that_came() -> None:
    release = threading.Event()
    lines: list[dict[str, object]] = []

    def source() -> Iterator[Any]:
        path = "/devices/pci0000:85/0000:85:01.0/0000:86:00.0"
        yield types.SimpleNamespace(action="add", device_path=path)
        release.wait(10)

    async def rescan() -> None:  # runs its scan in a thread, as the plugin's does
        record = await asyncio.to_thread(lambda: logging.makeLogRecord({"msg": "scan"}))
        lines.append(json.loads(JsonFormatter().format(record)))

    task = asyncio.create_task(hotplug.watch(source(), rescan, debounce_s=0.01))
    try:
        for _ in range(200):
            if lines:
                break
            await asyncio.sleep(0.01)
        assert lines and lines[0]["device"] == "0000:86:00.0"
    finally:
        task.cancel()
        release.set()
        await asyncio.gather(task, return_exceptions=True)


def test_a_configured_process_reads_no_pid_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """No formatter writes the process id, so a record reads none: the
    plugin's hot path logs per claim pair, and each getpid is a syscall."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.logProcesses, logging.logMultiprocessing)
    pids: list[int] = []
    real_getpid = os.getpid

    def counted() -> int:
        pids.append(1)
        return real_getpid()

    monkeypatch.setattr(os, "getpid", counted)
    try:
        logconfig.configure("info")
        record = logging.getLogger("driver.test").makeRecord(
            "driver.test", logging.INFO, __file__, 1, "prepare %d", (1,), None
        )
        assert pids == [] and record.process is None
        assert "process" not in logconfig.context_of(record)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.logProcesses, logging.logMultiprocessing = saved[2], saved[3]
