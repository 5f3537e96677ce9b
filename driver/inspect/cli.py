"""The console script ``kubectl-patchbay`` (kubectl finds it on PATH as
``kubectl patchbay``). Read-only; flags as kubectl spells them.

    kubectl patchbay nodes [-o wide|json|yaml]
    kubectl patchbay topology NODE [-o wide|json|yaml]

``--kubeconfig`` / ``--context`` pick the cluster (``$KUBECONFIG`` and
``~/.kube/config`` otherwise, in-cluster configuration last). ``-n`` is
accepted for kubectl's sake; both views are cluster-wide because a device
is used whichever namespace's claim holds it. One asyncio run per command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from driver.errors import ApiError
from driver.inspect.fetch import snapshot
from driver.inspect.nodes import nodes_view, render_nodes
from driver.inspect.topology import render_topology, topology_view


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl patchbay", description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", help="path to the kubeconfig file")
    p.add_argument("--context", help="the kubeconfig context to use")
    p.add_argument("-n", "--namespace", help="accepted; nodes and topology are cluster-wide")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("nodes", "devices per node, MIG bars"), ("topology", "PCIe tree")):
        s = sub.add_parser(name, help=text)
        if name == "topology":
            s.add_argument("node", help="the node's name")
        s.add_argument("-o", "--output", choices=("wide", "json", "yaml"), help="output format")
    return p


def render(
    args: argparse.Namespace, slices: list[dict[str, Any]], claims: list[dict[str, Any]]
) -> str:
    """The command's output for recorded ``slices`` and ``claims``."""
    wide = args.output == "wide"
    if args.command == "nodes":
        nodes = nodes_view(slices, claims)
        view: Any = nodes
        text = render_nodes(nodes, wide=wide)
    else:
        view = topology_view(slices, claims, args.node)
        text = render_topology(view, wide=wide)
    if args.output == "json":
        return json.dumps(view, indent=2) + "\n"
    if args.output == "yaml":
        return str(yaml.safe_dump(view, sort_keys=False, allow_unicode=True))
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        slices, claims = asyncio.run(snapshot(args.kubeconfig, args.context))
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "topology" and not any(
        (s.get("spec") or {}).get("nodeName") == args.node for s in slices
    ):
        print(f"error: no patchbay devices published for node {args.node!r}", file=sys.stderr)
        return 1
    sys.stdout.write(render(args, slices, claims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
