"""The simulated host's ``nvidia-smi``: the subcommands the driver runs.

``nvidia-smi compute-policy -i <uuid>[,<uuid>...] --set-timeslice <0-3>``
(NVIDIA's DRA driver applies TimeSlicing this way; NVML has no public call
for it). Like the real tool it refuses a GPU the host does not have (the
C mock's state lists them) and an interval outside 0-3, and changes nothing
then.

``nvidia-smi --gpu-reset -i <PCI bus id>`` (``-r``): like the real tool it
refuses a GPU any process holds: one listed as running on it (the state's
``"processes"``) or one with an NVML event set on it open (the state's
``"holders"``, recorded by the C mock; a holder that is no longer alive is
ignored); it fails on a lost GPU and where the state says the reset fails
(``"reset_failure": "<message>"``, for tests). A reset makes the GPU
disappear (``"lost"``) and come back with what a reset does
(``nvml_state.reset_entry``: pending MIG mode applied, instances gone,
recovery action, pending row remap and volatile ECC cleared); it stays off
the bus for ``<host>/gpu-reset-seconds`` (a number of seconds, written by
:func:`set_reset_seconds`; absent: no time), the one duration of a reset a
bench assumes. Not modelled: the root requirement (the simulated host runs
unprivileged).

What it was told is recorded in ``<host>/nvidia-smi.json``:
``{"timeslice": {uuid: n}, "calls": [argv, ...]}``, so tests can read each
GPU's interval and every call. The host's ``bin/nvidia-smi`` runs this.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    from fabric.simhost.nvml_state import NvmlStateFile, State, reset_entry
except ImportError:  # run as a plain script (the host's bin/nvidia-smi): its sibling
    from nvml_state import NvmlStateFile, State, reset_entry  # type: ignore[import-not-found,no-redef]

RECORD = "nvidia-smi.json"
RESET_SECONDS = "gpu-reset-seconds"
IN_USE_EXIT = 255  # "other error", as nvidia-smi ends a refused reset


def record_path(host_dir: Path) -> Path:
    return host_dir / RECORD


def read_record(host_dir: Path) -> dict[str, object]:
    path = record_path(host_dir)
    return json.loads(path.read_text()) if path.exists() else {"timeslice": {}, "calls": []}


def _record(host: Path, call: list[str], slices: dict[str, int] | None = None) -> None:
    with (host / f"{RECORD}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = read_record(host)
        timeslice, calls = record["timeslice"], record["calls"]
        assert isinstance(timeslice, dict) and isinstance(calls, list)
        timeslice.update(slices or {})
        calls.append(call)
        tmp = record_path(host).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(record_path(host))


def set_reset_seconds(host_dir: Path, seconds: float) -> None:
    """How long each later reset keeps its GPU off the bus."""
    (host_dir / RESET_SECONDS).write_text(f"{seconds}\n")


def _reset_seconds(host: Path) -> float:
    path = host / RESET_SECONDS
    return float(path.read_text()) if path.exists() else 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _bus(raw: str) -> str:
    domain, bus, rest = raw.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def gpu_reset(host: Path, bus_id: str) -> int:
    state_file = NvmlStateFile(host / "nvml-state.json")
    found: dict[str, Any] = {}

    def take(s: State) -> None:
        gpu = next((g for g in s["gpus"] if _bus(g["pci_bus_id"]) == _bus(bus_id)), None)
        if gpu is None:
            found["error"] = (6, f"No devices were found matching {bus_id}")
            return
        holders = sorted(set(gpu.get("processes", [])) | {
            p for p in gpu.get("holders", []) if _alive(p)
        })  # fmt: skip
        if gpu.get("lost"):
            found["error"] = (15, f"Unable to reset GPU {bus_id}: GPU is lost")
        elif holders:
            found["error"] = (IN_USE_EXIT, f"GPU {bus_id} is currently in use by another "
                              f"process (PIDs {holders}). Please first kill all processes "
                              "using the device and retry the command or reboot the system "
                              "to make GPU reset work.")  # fmt: skip
        elif gpu.get("reset_failure"):
            found["error"] = (IN_USE_EXIT - 1, f"Unable to reset GPU {bus_id}: "
                              f"{gpu['reset_failure']}")  # fmt: skip
        else:
            gpu["lost"] = True  # the GPU leaves the bus for the reset
            found["uuid"] = gpu["uuid"]

    state_file.update(take)
    _record(host, ["--gpu-reset", "-i", bus_id])
    if "error" in found:
        code, message = found["error"]
        print(message, file=sys.stderr)
        return int(code)

    time.sleep(_reset_seconds(host))  # off the bus while it resets

    def back(s: State) -> None:
        gpu = next(g for g in s["gpus"] if g["uuid"] == found["uuid"])
        reset_entry(gpu)
        gpu["lost"] = False

    state_file.update(back)
    print(f"GPU {bus_id} was successfully reset.\nAll done.")
    return 0


def compute_policy(host: Path, ids: str, timeslice: int) -> int:
    state = json.loads((host / "nvml-state.json").read_text())
    known = {g["uuid"] for g in state["gpus"] if not g.get("lost")}
    uuids = [u.strip() for u in ids.split(",") if u.strip()]
    unknown = [u for u in uuids if u not in known]
    if unknown:
        print(f"No devices were found matching {','.join(unknown)}", file=sys.stderr)
        return 6
    if not 0 <= timeslice <= 3:
        print(f"Invalid timeslice value {timeslice}: expected 0-3", file=sys.stderr)
        return 2
    call = ["compute-policy", "-i", ids, "--set-timeslice", str(timeslice)]
    _record(host, call, dict.fromkeys(uuids, timeslice))
    for uuid in uuids:
        print(f"Set timeslice to {timeslice} for GPU {uuid}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nvidia-smi")
    p.add_argument("--host", type=Path, required=True, help=argparse.SUPPRESS)
    p.add_argument("-r", "--gpu-reset", action="store_true")
    p.add_argument("-i", "--id", dest="gpu")
    sub = p.add_subparsers(dest="cmd")
    cp = sub.add_parser("compute-policy")
    cp.add_argument("-i", "--id", dest="ids", required=True)
    cp.add_argument("--set-timeslice", dest="timeslice", type=int, required=True)
    args = p.parse_args(argv)
    if args.cmd == "compute-policy":
        return compute_policy(args.host, args.ids, args.timeslice)
    if args.gpu_reset:
        if not args.gpu:
            print("--gpu-reset needs -i <PCI bus id>", file=sys.stderr)
            return 2
        return gpu_reset(args.host, args.gpu)
    p.print_usage(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
