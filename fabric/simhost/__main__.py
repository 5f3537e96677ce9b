"""CLI for simulated hosts, used by the demo and for poking at one by hand.

python -m fabric.simhost build --topology 2x-h100-nic --dir run/node-a
python -m fabric.simhost build --file topo.yaml --dir run/node-a
python -m fabric.simhost hot-add --dir run/node-a --adapter adapter0 --gpu H100-SXM5-80GB
python -m fabric.simhost hot-add --dir run/node-a --adapter adapter0 --nvme S6CKNT0W700001
python -m fabric.simhost hot-add --dir run/node-a --adapter adapter0 --cxl 0x4c1d96fffeddd835
python -m fabric.simhost memory-in-use --dir run/node-a --bdf 0000:17:00.0 [--clear]
python -m fabric.simhost hot-remove --dir run/node-a --bdf 0000:16:00.0
python -m fabric.simhost list
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import yaml

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES
from fabric.simhost.topology import CxlMemory, Gpu, Nic, Nvme, TopologySpec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fabric.simhost")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="lay out a simulated host")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--topology", choices=sorted(TOPOLOGIES))
    src.add_argument("--file", type=Path, help="topology as YAML or JSON")
    b.add_argument("--dir", type=Path, required=True)
    b.add_argument("--name", default="")
    a = sub.add_parser("hot-add", help="attach a device behind a fabric adapter")
    a.add_argument("--dir", type=Path, required=True)
    a.add_argument("--adapter", required=True)
    kind = a.add_mutually_exclusive_group(required=True)
    kind.add_argument("--gpu", metavar="MODEL")
    kind.add_argument("--nic", metavar="NETDEV")
    kind.add_argument("--nvme", metavar="SERIAL", help="an NVMe drive with this serial")
    kind.add_argument("--cxl", metavar="SERIAL", help="CXL memory with this serial (hex)")
    a.add_argument("--size", type=int, default=0, help="bytes (NVMe namespace, CXL memory)")
    a.add_argument("--bdf", default="")
    m = sub.add_parser("memory-in-use", help="mark CXL memory in use: a detach is refused")
    m.add_argument("--dir", type=Path, required=True)
    m.add_argument("--bdf", required=True)
    m.add_argument("--clear", action="store_true", help="no longer in use")
    r = sub.add_parser("hot-remove", help="detach a device")
    r.add_argument("--dir", type=Path, required=True)
    r.add_argument("--bdf", required=True)
    e = sub.add_parser("effects", help="apply bind/unbind/drivers_probe writes until killed")
    e.add_argument("--dir", type=Path, required=True)
    sub.add_parser("list", help="ready-made topologies")
    args = p.parse_args(argv)

    if args.cmd == "list":
        for name, make in sorted(TOPOLOGIES.items()):
            print(f"{name:18} {(make.__doc__ or '').strip()}")
        return 0
    if args.cmd == "build":
        if args.file:
            topology = TopologySpec.model_validate(
                yaml.safe_load(args.file.read_text())
            ).to_topology()
        else:
            topology = TOPOLOGIES[args.topology]()
        host = SimHost.build(topology, args.dir, args.name)
        print(
            json.dumps(
                {"sysfs_root": str(host.sysfs_root), **host.env(), "uevents": str(host.uevent_path)}
            )
        )
        return 0
    host = SimHost.open(args.dir)
    if args.cmd == "effects":
        with host.effects_watcher():
            threading.Event().wait()
        return 0
    if args.cmd == "hot-add":
        bdf = args.bdf or host.free_bdf(args.adapter)
        device: Gpu | Nic | Nvme | CxlMemory
        if args.nvme:
            device = Nvme(bdf, serial=args.nvme)
            if args.size:
                device = Nvme(bdf, serial=args.nvme, namespaces=(args.size,))
        elif args.cxl:
            device = CxlMemory(bdf, int(args.cxl, 16), *((args.size,) if args.size else ()))
        else:
            device = Gpu(bdf, args.gpu) if args.gpu else Nic(bdf, args.nic)
        print(json.dumps(host.hot_add(args.adapter, device)))
    elif args.cmd == "memory-in-use":
        host.set_memory_in_use(args.bdf, not args.clear)
    else:
        print(json.dumps(host.hot_remove(args.bdf)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
