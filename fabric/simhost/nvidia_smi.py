"""The simulated host's ``nvidia-smi``: the one subcommand the driver runs.

``nvidia-smi compute-policy -i <uuid>[,<uuid>...] --set-timeslice <0-3>``
(NVIDIA's DRA driver applies TimeSlicing this way; NVML has no public call
for it). Like the real tool it refuses a GPU the host does not have (the
C mock's state lists them) and an interval outside 0-3, and changes nothing
then. What it was told is recorded in ``<host>/nvidia-smi.json``:
``{"timeslice": {uuid: n}, "calls": [argv, ...]}``, so tests can read each
GPU's interval and every call. The host's ``bin/nvidia-smi`` runs this.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
from pathlib import Path

RECORD = "nvidia-smi.json"


def record_path(host_dir: Path) -> Path:
    return host_dir / RECORD


def read_record(host_dir: Path) -> dict[str, object]:
    path = record_path(host_dir)
    return json.loads(path.read_text()) if path.exists() else {"timeslice": {}, "calls": []}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nvidia-smi")
    p.add_argument("--host", type=Path, required=True, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", required=True)
    cp = sub.add_parser("compute-policy")
    cp.add_argument("-i", "--id", dest="ids", required=True)
    cp.add_argument("--set-timeslice", dest="timeslice", type=int, required=True)
    args = p.parse_args(argv)
    state = json.loads((args.host / "nvml-state.json").read_text())
    known = {g["uuid"] for g in state["gpus"] if not g.get("lost")}
    uuids = [u.strip() for u in args.ids.split(",") if u.strip()]
    unknown = [u for u in uuids if u not in known]
    if unknown:
        print(f"No devices were found matching {','.join(unknown)}", file=sys.stderr)
        return 6
    if not 0 <= args.timeslice <= 3:
        print(f"Invalid timeslice value {args.timeslice}: expected 0-3", file=sys.stderr)
        return 2
    with (args.host / f"{RECORD}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = read_record(args.host)
        slices = record["timeslice"]
        calls = record["calls"]
        assert isinstance(slices, dict) and isinstance(calls, list)
        for uuid in uuids:
            slices[uuid] = args.timeslice
        calls.append(["compute-policy", "-i", args.ids, "--set-timeslice", str(args.timeslice)])
        tmp = record_path(args.host).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(record_path(args.host))
    for uuid in uuids:
        print(f"Set timeslice to {args.timeslice} for GPU {uuid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
