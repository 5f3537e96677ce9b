"""The ready-made demo/test fabric: 2 switches, 3 nodes, 4 GPUs and a NIC PF.

``write_demo(dir)`` builds three simulated hosts (``node-a``, ``node-b``,
``node-c``, each the ``fabric-adapters`` topology: a local NIC and empty
adapters ``adapter0`` on ``pci0000:15`` and ``adapter1`` on ``pci0000:85``)
and writes ``dir/fabric.json`` wiring them up:

    sw0 (PCIe): upstream node-a/adapter0, node-b/adapter0, node-c/adapter0
                slots gpu-0, gpu-1 (H100), nic-0 (ConnectX, 4 VFs), 1 empty
    sw1 (PCIe): upstream node-a/adapter1, node-b/adapter1
                slots gpu-2, gpu-3 (H200)

Run ``python -m fabric.service.demo DIR`` to lay it out on disk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fabric.simhost.host import SimHost
from fabric.simhost.topologies import TOPOLOGIES

NODES = ("node-a", "node-b", "node-c")


def _gpu(ident: str, model: str = "H100-SXM5-80GB") -> dict[str, str]:
    return {"kind": "gpu", "id": ident, "model": model}


def demo_spec() -> dict[str, Any]:
    def up(port: str, node: str, adapter: str) -> dict[str, str]:
        return {"port": port, "node": node, "adapter": adapter, "hostDir": node}

    return {
        "fabrics": [
            {
                "id": "pcie0",
                "type": "PCIe",
                "switches": [
                    {
                        "id": "sw0",
                        "upstream": [
                            up("up0", "node-a", "adapter0"),
                            up("up1", "node-b", "adapter0"),
                            up("up2", "node-c", "adapter0"),
                        ],
                        "slots": [
                            {"port": "slot0", "device": {"kind": "gpu", "id": "gpu-0"}},
                            {"port": "slot1", "device": {"kind": "gpu", "id": "gpu-1"}},
                            {
                                "port": "slot2",
                                "device": {
                                    "kind": "nic",
                                    "id": "nic-0",
                                    "netdev": "ens7f0np0",
                                    "totalVfs": 4,
                                    "numVfs": 4,
                                },
                            },
                            {"port": "slot3"},
                        ],
                    },
                    {
                        "id": "sw1",
                        "upstream": [
                            up("up0", "node-a", "adapter1"),
                            up("up1", "node-b", "adapter1"),
                        ],
                        "slots": [
                            {
                                "port": "slot0",
                                "device": _gpu("gpu-2", "H200-SXM5-141GB"),
                            },
                            {
                                "port": "slot1",
                                "device": _gpu("gpu-3", "H200-SXM5-141GB"),
                            },
                        ],
                    },
                ],
            }
        ]
    }


def write_demo(directory: Path) -> Path:
    """Build the demo's simulated hosts under ``directory``; returns the topology file."""
    directory.mkdir(parents=True, exist_ok=True)
    for node in NODES:
        if not (directory / node / "host.json").exists():
            SimHost.build(TOPOLOGIES["fabric-adapters"](), directory / node, node)
    path = directory / "fabric.json"
    path.write_text(json.dumps(demo_spec(), indent=1))
    return path


if __name__ == "__main__":
    print(write_demo(Path(sys.argv[1] if len(sys.argv) > 1 else "run/fabric")))
