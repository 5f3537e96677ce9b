"""Valid inputs the fuzz tests start from, and one run of the plugin on an
input: a claim (its one GPU, with an opaque config) prepared once, and a
checkpoint file the plugin starts on.

Why: the fuzz tests (tests/unit/test_fuzz_*.py) mutate these inputs and
test_malformed_inputs.py alters them by hand, one found bug a case; both
read them here, and run the plugin on them the same way."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import driver.vf.config  # noqa: F401  (registers VfConfig with the opaque decoder)
from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.config import opaque
from driver.devices.inventory import NodeInventory
from driver.devices.model import Device
from tests.checkpoint_view import recorded
from tests.claims_doubles import NODE, FlakyHandler, Reader

UID = "5b0f7d7e-2f4c-4a51-9d3e-0c8a6b2e1f40"
CONFIG_BODY = {
    "apiVersion": opaque.API_VERSION,
    "kind": "GpuConfig",
    "driverCapabilities": ["compute"],
}
RESULT = {"request": "gpu", "driver": "patchbay.dev", "pool": NODE, "device": "gpu-0"}
ENTRY = {
    "source": "FromClaim",
    "requests": ["gpu"],
    "opaque": {"driver": "patchbay.dev", "parameters": CONFIG_BODY},
}
CLAIM: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "c", "uid": UID},
    "status": {"allocation": {"devices": {"results": [RESULT], "config": [ENTRY]}}},
}


def prepare_claim(claim: dict[str, Any]) -> tuple[str, dict[str, Any], list[Path], set[str]]:
    """``claim`` (as ns/c, :data:`UID`) prepared once on a fresh node: the
    error, the checkpoint's records, the CDI files and the devices set up."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inventory = NodeInventory()
        inventory.replace_pool(NODE, [Device("gpu-0", "gpu", "GPU-0", {"minor": 0})])
        handler = FlakyHandler(root / "dev")

        reader = Reader()
        reader.claims[("ns", "c")] = claim
        store = CheckpointStore(root / "cp.json", "boot")
        cdi = CdiRegistry(root / "cdi")
        prep = ClaimPreparer(reader, inventory, {"gpu": handler}, store, cdi)
        ref = ClaimRef("ns", "c", UID)
        result = asyncio.run(prep.prepare([ref]))[UID]
        saved = recorded(root / "cp.json")  # as a restart reads it: file and journal
        # Every file but the registry's spare (opened ahead of a write,
        # driver.sparefile): specs, and any debris a failure left.
        files = [p for p in (root / "cdi").glob("*") if p != cdi.spare.path]
        return result.error, saved.get("claims", {}), files, handler.active


DEVICE = {
    "request_names": ["r"],
    "pool_name": NODE,
    "device_name": "gpu-0",
    "kind": "gpu",
    "local_id": "GPU-0",
    "cdi_device_ids": [f"k8s.patchbay.dev/claim={UID}-gpu-0"],
    "undo": {},
}
RECORD = {
    "uid": UID,
    "namespace": "ns",
    "name": "c",
    "state": "PrepareCompleted",
    "devices": [DEVICE],
    "updated": 1.0,
    "cdi_spec": {"cdiVersion": "0.6.0", "kind": "k8s.patchbay.dev/claim", "devices": []},
}
CHECKPOINT: dict[str, Any] = {"version": 1, "boot_id": "boot", "claims": {UID: RECORD}}


def start(root: Path, data: dict[str, Any]) -> tuple[ClaimPreparer, FlakyHandler]:
    """A plugin starting on the checkpoint file ``data`` under ``root``."""
    (root / "cp.json").write_text(json.dumps(data))
    inventory = NodeInventory()
    inventory.replace_pool(NODE, [Device("gpu-0", "gpu", "GPU-0", {"minor": 0})])
    handler = FlakyHandler(root / "dev")
    store = CheckpointStore(root / "cp.json", "boot")
    cdi = CdiRegistry(root / "cdi")
    return ClaimPreparer(Reader(), inventory, {"gpu": handler}, store, cdi), handler
