"""A node of two fake-NVML GPUs with MIG support, its devices as the plugin
discovers them and the real GPU and MIG handlers, prepared and unprepared
one device at a time.

Why: the MIG prepare tests and the admin-access tests set MIG devices up
on the same node; it lives here once."""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint import Checkpoint
from driver.gpu.kind import GpuType
from driver.mig.discovery import MigSupport
from driver.mig.handler import MigHandler
from driver.mig.policy import MigPolicy
from driver.mig.session import NvmlSession
from driver.nvml.backend import NvmlBackend
from driver.nvml.fake import FakeNvml
from driver.nvml.fake_state import FakeMachine

UUID = "GPU-0000"


class Node:
    def __init__(self, model: str = "H100-SXM5-80GB", *, mig: bool = False,
                 checkpoint: Checkpoint | None = None, cleanup: bool = False,
                 backend: NvmlBackend | None = None) -> None:  # fmt: skip
        """``backend``: another NVML (pynvml over the C mock) whose GPUs are
        already there; then ``machine`` and ``gpu`` are not this node's."""
        self.machine = FakeMachine()
        for i in range(2):
            self.machine.add_gpu(f"GPU-{i:04d}", model, f"0000:{0x10 + i:02x}:00.0", mig=mig)
        backend = backend if backend is not None else FakeNvml(self.machine)
        self.support = MigSupport(
            NvmlSession(backend),
            MigPolicy.parse("all", "", True, cleanup),
            lambda s, g: MigHandler(s, g, Path("/nonexistent")),
            lambda: checkpoint or Checkpoint(),
        )
        self.type = GpuType(backend, Path("/nonexistent"), Path("/nonexistent"), mig=self.support)
        self.devices = {d.name: d for d in self.type.discover().devices}
        self.handlers = self.type.handlers()

    def prepare(self, name: str) -> tuple[dict[str, object], list[str]]:
        device = self.devices[name]
        handler = self.handlers[device.kind]
        undo = handler.plan_undo(device)
        prep = handler.prepare(device, "claim", None)
        return {**undo, **prep.undo}, [f"{k}={v}" for k, v in prep.claim_lists]

    def unprepare(self, name: str, undo: dict[str, object]) -> None:
        device = self.devices[name]
        self.handlers[device.kind].unprepare(device.kind, device.local_id, undo)

    def gpu(self, uuid: str = UUID):  # type: ignore[no-untyped-def]
        return self.machine.gpus[uuid]
