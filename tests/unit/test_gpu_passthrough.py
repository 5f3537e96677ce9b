"""GPU passthrough on the simulated host: a claim's GpuConfig asks for
``vfio-pci``, the GPU is rebound through the VF sequence (and leaves NVML),
its vfio nodes go to the container, unprepare and crash recovery give it back
to ``nvidia``, and a GPU in use (MIG, MPS daemon, open handles, a share)
is refused untouched."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.cdi import CdiRegistry
from driver.checkpoint import CheckpointStore
from driver.claims.model import ClaimRef
from driver.claims.preparer import ClaimPreparer
from driver.config import opaque
from driver.devices.inventory import NodeInventory
from driver.devices.model import PCI_BUS_ID, Device
from driver.errors import ConfigError, DeviceError
from driver.faults import PREPARE_POINTS, UNPREPARE_POINTS
from driver.gpu.passthrough import GpuPassthrough
from driver.gpu.prepare import GpuHandler
from driver.pci.writes import driver_of
from fabric.simhost.effects import EffectsWatcher
from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from tests.checkpoint_view import recorded
from tests.claims_doubles import Reader

GPU_BDF = "0000:3b:00.0"
PASSTHROUGH = {"apiVersion": opaque.API_VERSION, "kind": "GpuConfig", "passthrough": "vfio-pci"}


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return SimHost.build(TOPOLOGIES["2-gpus"](), tmp_path / "node")


@pytest.fixture
def kernel(host: SimHost) -> Iterator[EffectsWatcher]:
    with host.effects_watcher() as watcher:
        yield watcher


@pytest.fixture
def gpu(host: SimHost) -> Device:
    uuids = host.gpu_uuids()
    return Device("gpu-0", "gpu", uuids[GPU_BDF], {PCI_BUS_ID: GPU_BDF, "minor": 0})


def passthrough(host: SimHost, proc_root: Path | None = None, **kw: Any) -> GpuPassthrough:
    return GpuPassthrough(
        host.sysfs_root, host.dir / "dev", proc_root=proc_root or host.dir / "proc", **kw
    )


@pytest.fixture
def handler(host: SimHost) -> GpuHandler:
    (host.dir / "proc").mkdir()
    return GpuHandler(host.dir / "dev", passthrough=passthrough(host))


def config(**extra: object) -> opaque.DeviceConfig:
    return opaque.decode({**PASSTHROUGH, **extra}, "config[0]")


def test_binds_to_vfio_hides_from_nvml_and_restores(
    host: SimHost, gpu: Device, handler: GpuHandler, kernel: EffectsWatcher
) -> None:
    path = host.tree.path_of(GPU_BDF)
    assert handler.changes_device(config()) and not handler.changes_device(None)
    undo = handler.plan_undo(gpu, config())
    assert undo == {"pci": GPU_BDF, "driver": "nvidia", "override": None}
    prep = handler.prepare(gpu, str(uuid.uuid4()), config())
    assert host.tree.driver_of(GPU_BDF) == "vfio-pci"
    assert (path / "driver_override").read_text().strip() == "vfio-pci"
    assert GPU_BDF not in host.gpu_uuids(), "NVML still lists a GPU bound to vfio-pci"
    group = (path / "iommu_group").resolve().name
    nodes = {n.path: n for n in prep.edits.device_nodes}
    assert set(nodes) == {f"/dev/vfio/{group}", "/dev/vfio/vfio"}
    assert (nodes["/dev/vfio/vfio"].major, nodes["/dev/vfio/vfio"].minor) == (10, 196)
    assert f"PATCHBAY_GPU_0_VFIO_GROUP={group}" in prep.edits.env
    assert f"PATCHBAY_GPU_0_PCI_BUS_ID={GPU_BDF}" in prep.edits.env
    assert prep.claim_lists == (), "a VM's GPU is not one for the NVIDIA container toolkit"
    handler.prepare(gpu, str(uuid.uuid4()), config())  # bound already: a no-op
    handler.unprepare("gpu", gpu.local_id, undo)
    assert host.tree.driver_of(GPU_BDF) == "nvidia"
    assert (path / "driver_override").read_text().strip() in ("", "(null)")
    assert host.gpu_uuids()[GPU_BDF] == gpu.local_id
    handler.unprepare("gpu", gpu.local_id, undo)  # idempotent
    assert host.tree.driver_of(GPU_BDF) == "nvidia"


def test_a_cuda_claim_changes_nothing(host: SimHost, gpu: Device, handler: GpuHandler) -> None:
    undo = handler.plan_undo(gpu)
    assert undo == {}  # nothing read from sysfs for it (issue 36), nothing to give back
    prep = handler.prepare(gpu, str(uuid.uuid4()), None)
    assert prep.claim_lists == (("NVIDIA_VISIBLE_DEVICES", gpu.local_id),)
    handler.unprepare("gpu", gpu.local_id, undo)  # no kernel effects run: no write was made
    assert host.tree.driver_of(GPU_BDF) == "nvidia"
    assert (host.tree.path_of(GPU_BDF) / "driver_override").read_text().strip() == "(null)"


def test_config_refuses_sharing_or_capabilities_with_passthrough() -> None:
    with pytest.raises(ConfigError, match="sharing: not with passthrough 'vfio-pci'"):
        config(sharing={"strategy": "TimeSlicing"})
    with pytest.raises(ConfigError, match="driverCapabilities: not with passthrough"):
        config(driverCapabilities=["compute"])
    with pytest.raises(ConfigError, match="field passthrough"):
        opaque.decode({**PASSTHROUGH, "passthrough": "vfio"}, "config[0]")


def test_passthrough_config_on_a_mig_device_is_refused() -> None:
    with pytest.raises(ConfigError, match="whole GPUs only, not to device gpu-0-mig-1g-0 of type"):
        opaque.effective([config()], "mig", "gpu-0-mig-1g-0")
    assert opaque.effective([config()], "gpu", "gpu-0") == config()


def test_a_mig_device_is_refused(host: SimHost, gpu: Device, handler: GpuHandler) -> None:
    mig = Device("gpu-0-mig-1g", "mig", "MIG-x", {PCI_BUS_ID: GPU_BDF})
    with pytest.raises(DeviceError, match="is a mig device; only a whole GPU"):
        handler.prepare(mig, str(uuid.uuid4()), config())


def test_mig_refusal_leaves_the_gpu_alone(host: SimHost, gpu: Device) -> None:
    (host.dir / "proc").mkdir()
    seen: list[str] = []

    def mig(uuid: str) -> str:
        seen.append(uuid)
        return "it holds 2 MIG instances; release them first"

    h = GpuHandler(host.dir / "dev", passthrough=passthrough(host, mig_refusal=mig))
    with pytest.raises(DeviceError, match=r"cannot be handed over to vfio-pci: it holds 2 MIG"):
        h.prepare(gpu, str(uuid.uuid4()), config())
    assert seen == [gpu.local_id]
    assert host.tree.driver_of(GPU_BDF) == "nvidia"
    assert (host.tree.path_of(GPU_BDF) / "driver_override").read_text().strip() == "(null)"


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line and environment look like an MPS control
    daemon serving one GPU (the scan reads /proc/<pid>/{cmdline,environ})."""
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text("import sys\nsys.stdin.read()\n")
    proc = subprocess.Popen(
        [sys.executable, str(exe), "-d"],
        stdin=subprocess.PIPE,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-placeholder"},
    )
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()


def test_an_mps_daemon_serving_the_gpu_is_refused(
    host: SimHost, gpu: Device, sleeper: subprocess.Popen[bytes]
) -> None:
    served = Device(gpu.name, "gpu", "GPU-placeholder", gpu.attributes)
    h = GpuHandler(host.dir / "dev", passthrough=passthrough(host, Path("/proc")))
    with pytest.raises(
        DeviceError, match=rf"an MPS control daemon serves it \(pid {sleeper.pid}\)"
    ):
        h.prepare(served, str(uuid.uuid4()), config())
    assert host.tree.driver_of(GPU_BDF) == "nvidia"


def test_a_process_holding_the_gpu_node_is_refused(
    host: SimHost, gpu: Device, tmp_path: Path
) -> None:
    proc = tmp_path / "fakeproc" / "4242"
    (proc / "fd").mkdir(parents=True)
    (proc / "cmdline").write_bytes(b"/usr/bin/python\0train.py\0")
    (proc / "environ").write_bytes(b"PATH=/bin\0")
    (proc / "fd" / "3").symlink_to("/dev/nvidia0")
    h = GpuHandler(host.dir / "dev", passthrough=passthrough(host, tmp_path / "fakeproc"))
    with pytest.raises(DeviceError, match=r"1 process\(es\) hold /dev/nvidia0 open \(pids 4242\)"):
        h.prepare(gpu, str(uuid.uuid4()), config())
    assert host.tree.driver_of(GPU_BDF) == "nvidia"


def vm_claim(reader: Reader, device: str, params: dict[str, Any]) -> ClaimRef:
    """Claim ``vm`` of ``device`` with the class's opaque ``params``."""
    config = [{"source": "FromClass", "opaque": {"driver": "patchbay.dev", "parameters": params}}]
    return reader.add("vm", {"vm": [device]}, pool="node", config=config)


def preparer(
    host: SimHost, gpu: Device, handler: GpuHandler, tmp_path: Path, reader: Reader | None = None
) -> tuple[ClaimPreparer, Reader]:
    """A (re)started plugin's preparer over this node's disk and API server."""
    inv = NodeInventory()
    inv.replace_pool("node", [gpu])
    reader = reader or Reader()
    store = CheckpointStore(tmp_path / "cp.json", "boot")
    cdi = CdiRegistry(tmp_path / "cdi")
    return ClaimPreparer(reader, inv, {"gpu": handler}, store, cdi), reader


async def test_only_a_passthrough_claim_goes_to_a_worker_thread(
    host: SimHost,
    gpu: Device,
    handler: GpuHandler,
    kernel: EffectsWatcher,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With passthrough wired, a CUDA claim's prepare and unprepare are a stat
    call and a checkpoint write: they stay on the event loop; a claim that
    asks for vfio-pci waits on sysfs and goes to a thread (issue 36)."""
    prep, reader = preparer(host, gpu, handler, tmp_path)
    hops: list[str] = []
    real = asyncio.to_thread

    async def counted(fn: Any, *args: Any) -> Any:
        hops.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr("driver.claims.preparer.asyncio.to_thread", counted)
    cuda = reader.add("cuda", {"vm": ["gpu-0"]}, pool="node")
    assert (await prep.prepare([cuda]))[cuda.uid].error == ""
    assert (await prep.unprepare([cuda]))[cuda.uid] == ""
    assert hops == []
    vm = vm_claim(reader, "gpu-0", PASSTHROUGH)
    assert (await prep.prepare([vm]))[vm.uid].error == ""
    assert (await prep.unprepare([vm]))[vm.uid] == ""
    assert hops == ["_prepare_sync", "_unprepare_sync"]
    assert host.tree.driver_of(GPU_BDF) == "nvidia"


async def test_through_the_preparer_checkpointed_and_restored(
    host: SimHost, gpu: Device, handler: GpuHandler, kernel: EffectsWatcher, tmp_path: Path
) -> None:
    prep, reader = preparer(host, gpu, handler, tmp_path)
    vm = vm_claim(reader, "gpu-0", PASSTHROUGH)
    assert (await prep.prepare([vm]))[vm.uid].error == ""
    assert host.tree.driver_of(GPU_BDF) == "vfio-pci"
    saved = recorded(tmp_path / "cp.json")  # the file, its journal replayed
    assert saved["claims"][vm.uid]["devices"][0]["undo"]["pci"] == GPU_BDF
    spec = json.loads(next((tmp_path / "cdi").glob("*.json")).read_text())
    paths = {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    assert "/dev/vfio/vfio" in paths
    assert (await prep.unprepare([vm]))[vm.uid] == ""
    assert host.tree.driver_of(GPU_BDF) == "nvidia"


class Crash(BaseException):
    """The process dies here: no rollback, no answer (SIGKILL in production)."""


@pytest.mark.parametrize("point", PREPARE_POINTS + UNPREPARE_POINTS)
async def test_a_crash_at_any_step_gives_the_gpu_back(
    point: str,
    host: SimHost,
    gpu: Device,
    handler: GpuHandler,
    kernel: EffectsWatcher,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plugin dies at ``point``; the next process's recovery (and the
    kubelet's retry) converge, and the final unprepare leaves the GPU on
    nvidia and listed by NVML: the undo data was on disk before the bind."""
    first, reader = preparer(host, gpu, handler, tmp_path)
    vm = vm_claim(reader, "gpu-0", PASSTHROUGH)

    def crash_point(name: str) -> None:
        if name == point:
            raise Crash(name)

    monkeypatch.setattr("driver.claims.preparer.crash_point", crash_point)
    with pytest.raises(Crash):
        if point in UNPREPARE_POINTS:
            assert (await first.prepare([vm]))[vm.uid].error == ""
            await first.unprepare([vm])
        else:
            await first.prepare([vm])
    monkeypatch.undo()

    again, _ = preparer(host, gpu, handler, tmp_path, reader)
    await again.recover()
    if point in PREPARE_POINTS:
        assert (await again.prepare([vm]))[vm.uid].error == ""
        assert host.tree.driver_of(GPU_BDF) == "vfio-pci"
    assert (await again.unprepare([vm]))[vm.uid] == ""
    assert host.tree.driver_of(GPU_BDF) == "nvidia"
    assert host.gpu_uuids()[GPU_BDF] == gpu.local_id


def test_a_driver_link_that_goes_while_it_is_read_reads_as_unbound(
    host: SimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel removes a ``driver`` link while it unbinds, between any two
    calls of a reader; the passthrough unbind polls it (issue 33: ``realpath``
    raised FileNotFoundError when the link went between its lstat and its
    readlink, 2 runs in 25 of this module under load)."""
    path = host.tree.path_of(GPU_BDF)
    assert driver_of(path) == "nvidia"
    real, unbinding = os.readlink, list[Any]()

    def unbound_meanwhile(link: Any) -> str:
        if Path(link).name == "driver" and not unbinding:
            unbinding.append(link)
            host.tree.unbind(GPU_BDF)  # the kernel, between the reader's calls
        return str(real(link))

    monkeypatch.setattr(os, "readlink", unbound_meanwhile)
    assert driver_of(path) is None
