"""Read-only probe of the real-NVML discovery path on a machine with a real GPU.

Why this exists: every tier runs NVML through the real ``pynvml`` loading our
C mock (hack/nvml-mock). When a session is lent a machine with a real NVIDIA
GPU, this script runs the same code the plugin runs at discovery against the
real ``libnvidia-ml.so`` and checks what it publishes against
``nvidia-smi``'s own answers. It changes nothing on the GPU: no MIG mode, no
instance, no compute mode, no reset (it calls only NVML's getters and
registers for events). hack/nvml-mock/README.md, "Checked against a real
GPU", says how to run it and what the last run found.

Usage: ``python hack/gpu_probe.py [--busy] [REPORT.json]``; exit status 1
when a check fails. ``--busy`` also runs a CUDA workload (PyTorch) on the
first GPU and checks what the idle sampler reads during and after it. Each
step's answer or exact NVML error goes into the report.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from functools import partial
from pathlib import Path
from typing import Any

from driver.devices.model import Device
from driver.errors import NvmlError
from driver.gpu.discovery import semver
from driver.gpu.prepare import GpuHandler
from driver.gpu.scan import SysfsTopology, scan_gpus
from driver.mig.layout import counter_set, full_gpu, mig_devices
from driver.nvml.backend import normalize_bus_id
from driver.nvml.pynvml_backend import PynvmlBackend

SMI_FIELDS = "uuid,pci.bus_id,name,memory.total,compute_cap,driver_version,mig.mode.current"
# The backend's per-GPU getters the probe reads, besides MIG profiles and events.
READS = (
    "condition",
    "utilization",
    "compute_mode",
    "running_processes",
    "process_utilization",
    "mig_instances",
)


def plain(value: Any) -> Any:
    """A JSON-ready copy of an NVML answer (dataclasses, tuples, enums)."""
    if is_dataclass(value) and not isinstance(value, type):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool | None) else repr(value)


def step(report: dict[str, Any], name: str, run: Callable[[], Any]) -> Any:
    """Run one read; its answer, or its exact error, goes into the report."""
    try:
        value = run()
    except NvmlError as exc:
        report[name] = {"error": str(exc), "code": exc.code}
        return None
    except Exception as exc:  # a probe: record whatever the real library says
        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return None
    report[name] = plain(value)
    return value


def smi_rows() -> list[dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    keys = SMI_FIELDS.split(",")
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return [dict(zip(keys, (f.strip() for f in row), strict=True)) for row in rows]


def compare(devices: list[Device], smi: list[dict[str, str]]) -> list[str]:
    """What our published GPUs say against nvidia-smi; each line a mismatch."""
    ours = {str(d.attributes["uuid"]): d for d in devices}
    problems = []
    if sorted(ours) != sorted(r["uuid"] for r in smi):
        problems.append(f"GPUs: ours {sorted(ours)}, nvidia-smi {[r['uuid'] for r in smi]}")
    for row in smi:
        dev = ours.get(row["uuid"])
        if dev is None:
            continue
        a = dev.attributes
        want = {
            "pciBusID": normalize_bus_id(row["pci.bus_id"]),
            "productName": row["name"],
            "cudaComputeCapability": semver(row["compute_cap"]),
            "driverVersion": semver(row["driver_version"]),
        }
        got = {
            "pciBusID": a.get("resource.kubernetes.io/pciBusID"),
            "productName": a.get("productName"),
            "cudaComputeCapability": a.get("cudaComputeCapability"),
            "driverVersion": a.get("driverVersion"),
        }
        problems += [
            f"{row['uuid']} {k}: ours {got[k]!r}, nvidia-smi {v!r}"
            for k, v in want.items()
            if got[k] != v
        ]
        memory = dev.capacity["memory"]
        smi_mib = row["memory.total"]
        if memory != f"{int(smi_mib)}Mi":
            problems.append(f"{row['uuid']} memory: ours {memory}, nvidia-smi {smi_mib} MiB")
    return problems


def check_nodes(report: dict[str, Any], devices: list[Device]) -> list[str]:
    """A whole-GPU claim's CDI device nodes (the GPU's and the common ones, as
    the plugin's GPU handler writes them) against the host's ``/dev``."""
    handler = GpuHandler(Path("/dev"))
    nodes = [n for d in devices for n in handler.prepare(d, "probe", None).edits.device_nodes]
    common = handler.common_edits()
    nodes += list(common.device_nodes) if common is not None else []
    report["cdi_device_nodes"] = plain(nodes)
    problems = []
    for node in nodes:
        try:
            st = Path(node.path).stat()
        except OSError as exc:
            problems.append(f"CDI node {node.path}: {exc}")
            continue
        host = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if not stat.S_ISCHR(st.st_mode) or host != (node.major, node.minor):
            problems.append(f"CDI node {node.path}: ours {node.major}:{node.minor}, host {host}")
    return problems


# A CUDA workload for --busy: matrix products for BUSY_SECONDS once CUDA is up
# (the image of a lent GPU machine carries PyTorch; its import takes seconds).
BUSY_SECONDS = 10
BUSY = (
    "import time, torch\n"
    "a = torch.randn(8192, 8192, device='cuda')\n"
    f"end = time.monotonic() + {BUSY_SECONDS}\n"
    "while time.monotonic() < end:\n"
    "    a = (a @ a).tanh()\n"
    "    torch.cuda.synchronize()\n"
)


def busy(report: dict[str, Any], nvml: PynvmlBackend, uuid: str) -> list[str]:
    """What the idle sampler reads (driver/idle) while a CUDA process works on
    the GPU and after it has gone: its pid among the running processes, GPU
    and per-process utilization above 0, and no pid left afterwards."""
    worker = subprocess.Popen([sys.executable, "-c", BUSY])
    seen: dict[str, Any] = {"pid": worker.pid, "samples": []}
    report["busy"] = seen
    try:
        while worker.poll() is None and len(seen["samples"]) < 120:  # 2 min at most
            time.sleep(1)
            seen["samples"].append(
                {
                    "running": nvml.running_processes(uuid),
                    "utilization": nvml.utilization(uuid),
                    "processes": plain(nvml.process_utilization(uuid)),
                }
            )
    finally:
        worker.kill()  # done by now, unless CUDA hung
        worker.wait(timeout=60)
    seen["after"] = nvml.running_processes(uuid)
    samples = seen["samples"]
    problems = []
    if not any(worker.pid in s["running"] for s in samples):
        problems.append(f"busy: pid {worker.pid} never among the running processes")
    if not any(s["utilization"] > 0 for s in samples):
        problems.append("busy: GPU utilization stayed 0 under a CUDA workload")
    if not any(p["pid"] == worker.pid and p["sm"] > 0 for s in samples for p in s["processes"]):
        problems.append(f"busy: no per-process sample with SM use for pid {worker.pid}")
    if worker.pid in seen["after"]:
        problems.append(f"busy: pid {worker.pid} still listed after it exited")
    return problems


def probe(report: dict[str, Any], with_load: bool) -> list[str]:
    nvml = PynvmlBackend()
    topology = SysfsTopology(Path("/sys"))
    timings = []
    devices: list[Device] = []
    for _ in range(5):  # a scan inits NVML, reads every GPU, shuts NVML down
        start = time.monotonic()
        devices = scan_gpus(nvml, topology)
        timings.append(round((time.monotonic() - start) * 1000, 1))
    report["scan_ms"] = timings
    report["published"] = [d.to_json() for d in devices]
    problems: list[str] = []
    nvml.init()
    try:
        step(report, "system_info", nvml.system_info)
        for number, gpu in enumerate(nvml.gpus()):
            g: dict[str, Any] = {"info": plain(gpu)}
            report[f"gpu-{number}"] = g
            u = gpu.uuid
            for name in READS:
                step(g, name, partial(getattr(nvml, name), u))
            profiles = step(g, "mig_profiles", partial(nvml.mig_profiles, u))
            if profiles and number < len(devices):
                offered = mig_devices(full_gpu(devices[number], number), number, profiles)
                g["mig_offered"] = [d.name for d in offered]
                g["mig_counter_set"] = counter_set(number).to_json()

            def events(uuid: str = u) -> str:
                watcher = nvml.watch_events([uuid])
                try:
                    return f"{len(watcher.wait(1000))} events in 1 s"
                finally:
                    watcher.close()

            step(g, "watch_events", events)
            if with_load and number == 0:
                problems += busy(report, nvml, u)
    finally:
        nvml.shutdown()
    smi = smi_rows()
    report["nvidia_smi"] = smi
    return problems + compare(devices, smi) + check_nodes(report, devices)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--busy"]
    report: dict[str, Any] = {}
    problems = probe(report, "--busy" in sys.argv[1:])
    report["problems"] = problems
    text = json.dumps(report, indent=2, default=str)
    if args:
        Path(args[0]).write_text(text)
    else:
        print(text)
    for line in problems:
        print("mismatch:", line)
    print("gpu probe:", "PASS" if not problems else f"FAIL ({len(problems)} mismatches)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
