"""The console script ``kubectl-patchbay`` (kubectl finds it on PATH as
``kubectl patchbay``). Read-only but for ``lease extend`` (which asks for
more time on a claim, as the user); flags as kubectl spells them.

    kubectl patchbay nodes [-o wide|json|yaml]
    kubectl patchbay topology NODE [-o wide|json|yaml] [--svg FILE]
    kubectl patchbay claims [-n NS | -A] [-o wide|json|yaml]
    kubectl patchbay fabric [--fabric-pool NAME] [-o wide|json|yaml]
    kubectl patchbay leases [-n NS | -A] [-o wide|json|yaml]
    kubectl patchbay lease extend CLAIM --by 2h --reason "..." [-n NS]

``--kubeconfig`` / ``--context`` pick the cluster (``$KUBECONFIG`` and
``~/.kube/config`` otherwise, in-cluster configuration last); they and
``-n``/``-A`` go before or after the command, as with kubectl. ``claims``
and ``leases`` show the context's namespace unless ``-n`` or ``-A`` says otherwise; the
other views are cluster-wide (a device is used whichever namespace's claim
holds it). One asyncio run per command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from driver.errors import ApiError, ApiStatusError, ConfigError
from driver.fabric_devices.naming import FABRIC_POOL
from driver.inspect.claims import claims_view, render_claims
from driver.inspect.extend import request_extension
from driver.inspect.fabric import fabric_view, render_fabric
from driver.inspect.fetch import Snapshot, Wants, default_kubeconfig, default_namespace, snapshot
from driver.inspect.leases import leases_view, render_leases
from driver.inspect.nodes import nodes_view, render_nodes
from driver.inspect.svg import render_svg
from driver.inspect.topology import render_topology, topology_view
from driver.kube.api import KubeApi

COMMANDS = {
    "nodes": "devices per node, MIG bars, GPU health and its recent steps",
    "topology": "PCIe tree of one node",
    "claims": "claims with devices, binding state and last error",
    "fabric": "the fabric pool as the controller sees it",
    "leases": "who holds each claim, why, and until when",
}


def _common(p: argparse.ArgumentParser, top: bool) -> None:
    # Sub-commands take the same flags; SUPPRESS keeps theirs from hiding the top ones.
    d: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--kubeconfig", help="path to the kubeconfig file", **d)
    p.add_argument("--context", help="the kubeconfig context to use", **d)
    p.add_argument("-n", "--namespace", help="claims, leases: the namespace to show", **d)
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="claims, leases: every namespace", **d
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl patchbay", description=__doc__.split("\n")[0])
    _common(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        s = sub.add_parser(name, help=text)
        _common(s, top=False)
        if name == "topology":
            s.add_argument("node", help="the node's name")
            s.add_argument("--svg", metavar="FILE", help="also write the tree as an SVG picture")
        if name == "fabric":
            s.add_argument("--fabric-pool", default=FABRIC_POOL, help="the fabric pool's name")
        s.add_argument("-o", "--output", choices=("wide", "json", "yaml"), help="output format")
    lease = sub.add_parser("lease", help="ask for more time on a claim's device lease")
    _common(lease, top=False)
    lease.add_argument("action", choices=("extend",))
    lease.add_argument("claim", help="the claim's name")
    lease.add_argument("--by", required=True, help="how much more time (e.g. 30m, 2h)")
    lease.add_argument("--reason", required=True, help="why (recorded in the Event)")
    return p


def wants(args: argparse.Namespace) -> Wants:
    if args.command == "claims":
        return Wants(events=True, namespace=namespace_of(args))
    if args.command == "fabric":
        return Wants(events=True, nodes=True)
    if args.command == "nodes":
        return Wants(nodes=True)  # the GPUs' health (patchbay.dev/health)
    if args.command == "leases":
        return Wants(namespace=namespace_of(args))
    return Wants()


def namespace_of(args: argparse.Namespace) -> str | None:
    """``claims``' and ``leases``' namespace: None for ``-A``, else ``-n``, else the context's."""
    if args.all_namespaces:
        return None
    return str(args.namespace or default_namespace(args.kubeconfig, args.context))


def view_of(args: argparse.Namespace, snap: Snapshot, now: datetime) -> tuple[Any, str]:
    """The command's view (plain data) and its text."""
    wide = args.output == "wide"
    if args.command == "nodes":
        nodes = nodes_view(snap.slices, snap.claims, snap.nodes, now)
        return nodes, render_nodes(nodes, wide=wide)
    if args.command == "topology":
        tree = topology_view(snap.slices, snap.claims, args.node)
        return tree, render_topology(tree, wide=wide)
    if args.command == "claims":
        ns = namespace_of(args)
        rows = claims_view(snap.slices, snap.claims, snap.events, now, ns)
        return rows, render_claims(rows, wide=wide, all_ns=ns is None)
    if args.command == "leases":
        ns = namespace_of(args)
        held = leases_view(snap.claims, now, ns)
        return held, render_leases(held, wide=wide, all_ns=ns is None)
    fab = fabric_view(snap.slices, snap.claims, snap.nodes, snap.events, now, args.fabric_pool)
    return fab, render_fabric(fab, wide=wide)


def render(args: argparse.Namespace, snap: Snapshot, now: datetime | None = None) -> str:
    """The command's output for a recorded snapshot."""
    view, text = view_of(args, snap, now or datetime.now(UTC))
    if args.output == "json":
        return json.dumps(view, indent=2) + "\n"
    if args.output == "yaml":
        return str(yaml.safe_dump(view, sort_keys=False, allow_unicode=True))
    return text


async def _extend(args: argparse.Namespace) -> str:
    api = await KubeApi.connect(default_kubeconfig(args.kubeconfig), args.context)
    try:
        ns = str(namespace_of(args) or "default")
        await request_extension(api, ns, args.claim, args.by, args.reason)
    finally:
        await api.close()
    return (f"extension of {ns}/{args.claim} by {args.by} accepted; the controller applies it "
            f"(kubectl describe resourceclaim -n {ns} {args.claim}: LeaseExtended)\n")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "lease":
        try:
            sys.stdout.write(asyncio.run(_extend(args)))
        except ApiStatusError as exc:
            message = json.loads(exc.body).get("message", exc.body) if exc.body else str(exc)
            print(f"error: {message}", file=sys.stderr)
            return 1
        except (ApiError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        snap = asyncio.run(snapshot(args.kubeconfig, args.context, wants(args)))
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "topology":
        if not any((s.get("spec") or {}).get("nodeName") == args.node for s in snap.slices):
            print(f"error: no patchbay devices published for node {args.node!r}", file=sys.stderr)
            return 1
        if args.svg:
            Path(args.svg).write_text(
                render_svg(topology_view(snap.slices, snap.claims, args.node))
            )
    sys.stdout.write(render(args, snap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
