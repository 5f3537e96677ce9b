"""The leaner MIG slices (issue 26) keep what classes, claims and tools use.

Each check runs on one node's pool as the plugin builds it (``scale_pool``:
4 x H100 with dynamic MIG, fractional shares and VFs) in two shapes: the
one before issue 26 (``tests/bench/mig_shape_v1.py``) and the lean one the
plugin publishes now. Selectors are evaluated by ``hack/dra-cel``, the
scheduler's own CEL library (``k8s.io/dynamic-resource-allocation/cel``
v0.37.2), as the allocator evaluates them: a request's class selectors,
then its own, stopping at the first false one; an error fails the claim.

- every DeviceClass (``deviceclasses/``), every request of every example
  (``deviceclasses/examples/``, Kueue's per-profile templates included)
  selects on the lean pool exactly the devices it selected before, less
  the ``+me`` placements no longer offered, and never errors;
- CEL naming a dropped attribute errors on a MIG device (docs/scale.md
  warns users of exactly these names);
- ``kubectl patchbay nodes`` and ``topology`` show the same partitions;
- an old plugin's pool is rewritten to the lean shape with no slice left.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver import DRIVER_NAME
from driver.devices.model import Device
from driver.inspect.nodes import nodes_view
from driver.inspect.topology import topology_view
from driver.kube.api import slice_path
from driver.kube.memory import MemoryKube
from driver.slices.build import PoolSpec, build_slices, slice_object
from driver.slices.publisher import SlicePublisher
from tests.bench.mig_bench import discovery
from tests.bench.mig_shape_v1 import old_shape
from tests.bench.scale_pool import MIG_NODE, HostPools
from tests.harness import gotool

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
NODE: Obj = {"metadata": {"name": "node-a", "uid": "5f0c1f39-62b6-4f5e-9d8e-00000000000a"}}
DROPPED = {
    "parentUUID", "parentIndex", "parentMinor", "placementStart", "productName",
    "architecture", "resource.kubernetes.io/pciBusID",
}  # fmt: skip
DROPPED_CAPACITIES = {"multiprocessors", "computeSlices"}


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> HostPools:
    return HostPools(work=tmp_path_factory.mktemp("host"))


@pytest.fixture(scope="module")
def shapes(pools: HostPools) -> tuple[list[Obj], list[Obj]]:
    """(old, lean) slices of one node."""
    with old_shape():
        old = pools.slices(NODE, MIG_NODE)
    return old, pools.slices(NODE, MIG_NODE)


def devices(slices: list[Obj]) -> list[Obj]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def migs(slices: list[Obj]) -> list[Obj]:
    return [d for d in devices(slices) if d["attributes"]["type"] == {"string": "mig"}]


def evaluate(exprs: list[str], devs: list[Obj]) -> dict[str, list[str]]:
    """Each expression's result per device: "true", "false" or "error: ..."."""
    unique = sorted(set(exprs))
    payload = {"driver": DRIVER_NAME, "expressions": unique, "devices": devs}
    binary = gotool.built("dra-cel")
    done = subprocess.run(
        [str(binary)], input=json.dumps(payload), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    out = {}
    for expr, row in zip(unique, rows, strict=True):
        assert "compile" not in row, f"{expr!r} does not compile: {row['compile']}"
        out[expr] = row["cells"]
    return out


def yaml_docs() -> Iterator[tuple[str, Obj]]:
    for path in sorted((ROOT / "deviceclasses").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                yield str(path.relative_to(ROOT)), doc


def cel(selectors: list[Obj] | None) -> list[str]:
    return [s["cel"]["expression"] for s in selectors or [] if "cel" in s]


def requests() -> dict[str, list[str]]:
    """Every DeviceClass and every example request, as its selector chain."""
    classes = {
        doc["metadata"]["name"]: cel(doc["spec"].get("selectors"))
        for _, doc in yaml_docs()
        if doc.get("kind") == "DeviceClass"
    }
    out = {f"class {name}": exprs for name, exprs in classes.items()}
    for where, doc in yaml_docs():
        spec = doc.get("spec") or {}
        if doc.get("kind") == "ResourceClaimTemplate":
            spec = spec.get("spec") or {}
        elif doc.get("kind") != "ResourceClaim":
            continue
        for req in (spec.get("devices") or {}).get("requests") or []:
            subs = [req["exactly"]] if "exactly" in req else req.get("firstAvailable") or []
            for i, sub in enumerate(subs):
                key = f"{where} {doc['metadata']['name']}/{req['name']}/{i}"
                out[key] = classes[sub["deviceClassName"]] + cel(sub.get("selectors"))
    return out


def selected(chain: list[str], results: dict[str, list[str]], devs: list[Obj]) -> set[str]:
    """The devices a request gets offered, as the allocator walks a chain."""
    out = set()
    for i, dev in enumerate(devs):
        for expr in chain:
            cell = results[expr][i]
            assert not cell.startswith("error"), f"{dev['name']}: {expr!r}: {cell}"
            if cell != "true":
                break
        else:
            out.add(dev["name"])
    return out


def test_classes_and_examples_select_what_they_did_before(
    shapes: tuple[list[Obj], list[Obj]],
) -> None:
    old, lean = devices(shapes[0]), devices(shapes[1])
    chains = requests()
    assert any("kueue" in k for k in chains) and "class mig-1g.patchbay.dev" in chains
    exprs = [e for chain in chains.values() for e in chain]
    before, after = evaluate(exprs, old), evaluate(exprs, lean)
    kept = {d["name"] for d in lean}
    assert kept < {d["name"] for d in old}
    for key, chain in chains.items():
        was, now = selected(chain, before, old), selected(chain, after, lean)
        assert now == was & kept, key
        assert bool(now) == bool(was), key  # nothing that found a device finds none now


def test_the_mig_classes_still_tell_profiles_apart(shapes: tuple[list[Obj], list[Obj]]) -> None:
    lean = devices(shapes[1])
    chains = requests()
    results = evaluate([e for c in chains.values() for e in c], lean)
    profiles = {d["name"]: d["attributes"].get("profile", {}).get("string") for d in lean}

    def got(key: str) -> set[str | None]:
        return {profiles[n] for n in selected(chains[key], results, lean)}

    assert got("class mig-1g.patchbay.dev") == {"1g.10gb"}
    assert got("class mig-3g.patchbay.dev") == {"3g.40gb"}
    assert got("class mig-7g.patchbay.dev") == {"7g.80gb"}
    assert "1g.10gb+me" in got("class mig.patchbay.dev")
    # Kueue charges each MIG size to its own quota resource through these classes.
    config = yaml.safe_load((ROOT / "deviceclasses/examples/kueue/kueue-config.yaml").read_text())
    sizes = {
        m["name"].rsplit("-", 1)[1]: m["deviceClassNames"]
        for m in config["resources"]["deviceClassMappings"]
        if m["name"].startswith("patchbay.dev/mig-")
    }
    assert sorted(sizes) == ["1g", "2g", "3g", "4g", "7g"]
    for size, names in sizes.items():
        for name in names:
            found = got(f"class {name}")
            assert found and all(str(p).startswith(f"{size}.") for p in found), (name, found)


def test_only_the_listed_attributes_and_capacities_were_dropped(
    shapes: tuple[list[Obj], list[Obj]],
) -> None:
    old, lean = migs(shapes[0]), migs(shapes[1])
    names = [{k for d in shape for k in d["attributes"]} for shape in (old, lean)]
    assert names[0] - names[1] == DROPPED and names[1] <= names[0]
    caps = [{k for d in shape for k in d.get("capacity", {})} for shape in (old, lean)]
    assert caps[0] - caps[1] == DROPPED_CAPACITIES and caps[1] == {"memory"}


@pytest.mark.parametrize("name", sorted(DROPPED))
def test_a_dropped_attribute_is_named_by_no_selector_and_errors_in_cel(
    name: str, shapes: tuple[list[Obj], list[Obj]]
) -> None:
    """No class or example names it; a user's CEL that does fails on a MIG
    device, as docs/scale.md warns, unless it asks ``has()`` first."""
    old, lean = migs(shapes[0]), migs(shapes[1])
    assert all(name in d["attributes"] for d in old)
    assert not any(name in d["attributes"] for d in lean)
    domain, _, short = name.rpartition("/")
    assert not [k for k, chain in requests().items() if any(f".{short}" in e for e in chain)]
    ref = f'device.attributes["{domain or DRIVER_NAME}"].{short}'
    results = evaluate([f"has({ref})", f"{ref} == {ref}"], lean[:3])
    assert results[f"has({ref})"] == ["false"] * 3
    assert all(c.startswith("error: no such key") for c in results[f"{ref} == {ref}"])


@pytest.mark.parametrize("name", sorted(DROPPED_CAPACITIES))
def test_a_dropped_capacity_is_named_by_no_selector(
    name: str, shapes: tuple[list[Obj], list[Obj]]
) -> None:
    old, lean = migs(shapes[0]), migs(shapes[1])
    assert all(name in d["capacity"] for d in old)
    assert not any(name in d["capacity"] for d in lean)
    assert not [
        k for k, c in requests().items() if any("capacity[" in e and f".{name}" in e for e in c)
    ]
    ref = f'device.capacity["{DRIVER_NAME}"].{name}'
    results = evaluate([f"has({ref})"], lean[:3])
    assert results[f"has({ref})"] == ["false"] * 3


def test_placements_keep_their_order_less_the_extra_media_ones() -> None:
    """Each profile's candidates (what a first fit chooses among: a request
    names one profile) keep their order (``driver.mig.order``), less the +me
    placements above the lowest start, on 8 x H200."""

    def by_profile(devs: Sequence[Device]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for d in devs:
            out.setdefault(str(d.attributes.get("profile", "full")), []).append(d.name)
        return out

    lean = by_profile(discovery().devices)
    with old_shape():
        old = by_profile(discovery().devices)
    media = [n for n in old.pop("1g.18gb+me") if n.endswith("-0")]
    assert len(media) == 8 and lean.pop("1g.18gb+me") == media
    assert len(lean["1g.18gb"]) == 8 * 7 and lean == old


def claims(*held: str) -> list[Obj]:
    results = [
        {"request": f"r{i}", "driver": DRIVER_NAME, "pool": "node-a", "device": name}
        for i, name in enumerate(held)
    ]
    status = {"allocation": {"devices": {"results": results}}}
    return [{"metadata": {"namespace": "team", "name": "c"}, "status": status}]


def test_kubectl_patchbay_shows_the_same_partitions(shapes: tuple[list[Obj], list[Obj]]) -> None:
    held = claims("gpu-0-mig-3g-40gb-4", "gpu-0-mig-1g-10gb-0", "gpu-2-mig-1g-10gb-me-0")
    (old,), (lean,) = (nodes_view(s, held) for s in shapes)
    assert lean["mig"] == old["mig"]
    bars = {g["gpu"]: g["bar"] for g in lean["mig"]}
    assert bars["gpu-0"] == "[1g]······[3g······]" and bars["gpu-2"] == "[1g]··············"
    assert lean["devices"]["mig"]["used"] == 3

    def tree(view: Obj) -> dict[str, list[str]]:
        return {
            g["device"]: [m["device"] for m in g["mig"]] for r in view["roots"] for g in r["gpus"]
        }

    old_tree, lean_tree = (tree(topology_view(s, held, "node-a")) for s in shapes)
    assert lean_tree == old_tree
    assert lean_tree["gpu-0"] == ["gpu-0-mig-1g-10gb-0", "gpu-0-mig-3g-40gb-4"]
    assert lean_tree["gpu-2"] == ["gpu-2-mig-1g-10gb-me-0"]


async def test_an_old_plugins_pool_is_rewritten_with_no_slice_left() -> None:
    """An upgraded plugin finds the old plugin's pool (8 x H200: five slices)
    and replaces it with the lean one (four) at a new generation."""
    with old_shape():
        found = discovery()

    def spec(devs: Any) -> PoolSpec:
        return PoolSpec(DRIVER_NAME, "node-a", "node-a-patchbay", {"nodeName": "node-a"},
                        tuple(devs), found.counter_sets, owner={"uid": "u"})  # fmt: skip

    old = spec(found.devices)
    old_slices = build_slices(old)
    api = MemoryKube()
    for want in old_slices:
        api.add(slice_path(want.name), slice_object(old, want, 7, len(old_slices)))
    lean = spec(discovery().devices)
    publisher = SlicePublisher(api, {}, "node-a")
    publisher.set_pool(lean)
    task = asyncio.create_task(publisher.run())
    try:
        async with asyncio.timeout(10):
            await publisher.in_sync.wait()
    finally:
        task.cancel()
    stored = {o["metadata"]["name"]: o for o in api.objects(slice_path())}
    wanted = build_slices(lean)
    assert (len(old_slices), len(wanted)) == (5, 4)
    assert sorted(stored) == sorted(w.name for w in wanted)
    assert {(o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"])
            for o in stored.values()} == {(8, 4)}  # fmt: skip
    for w in wanted:
        assert {k: v for k, v in stored[w.name]["spec"].items() if k != "pool"} == w.spec
    assert not any(DROPPED & set(d["attributes"]) for o in stored.values()
                   for d in o["spec"].get("devices") or [] if d["name"].count("-mig-"))  # fmt: skip
