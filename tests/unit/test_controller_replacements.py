"""A node that lost a GPU is given a warm spare from the fabric (issue 38, replacement).

With ``spares_replace_failed`` on, the real reconciler (per-domain shape)
attaches a spare GPU to a node whose health annotation shows a local GPU
lost (replace class, or given up on), or on which a fabric GPU failed; the
spare is published in the node's own spare pool (no binding conditions),
one per GPU lost, none more once a claim took it, and released once the
GPU is back. Off (the default), nothing is attached. On the shipped
in-memory API and fabric (tests/unit/controller_world.py).
"""

from __future__ import annotations

from typing import Any

from driver.controller.reconciler import Reconciler
from driver.controller.spares.policy import Free, Spare, SpareRules, plan
from driver.controller.spares.replace import replacements
from driver.fabric_devices.naming import READY_CONDITION, variant_name
from driver.fabricclient.model import FabricInventory
from driver.health.history import HEALTH_ANNOTATION, GpuHistory, NodeHealth
from driver.metrics import CONTROLLER
from tests.unit.controller_world import MODEL, running, settings
from tests.unit.domain_claims import CLAIMS, claim, condition
from tests.unit.failing_world import FAILURE, Failing

SPARES = "fabric/spares/node-a"
LOST = GpuHistory("tainted", "replace", 79, "", "2026-12-03T10:00:00Z")


def replaced() -> float:
    return CONTROLLER.get_sample_value("patchbay_fabric_replacements_total") or 0.0


def noted(w: Failing, rec: Reconciler) -> None:
    """Each spare pass of ``rec`` wakes the test's waits."""
    keep = rec.spares.reconcile

    def passed(*args: Any) -> Any:
        view = keep(*args)
        w.changed.changed()
        return view

    rec.spares.reconcile = passed  # type: ignore[method-assign,assignment]


def rules(on: bool = True) -> Any:
    return settings(fabric_pool_shape="per-domain", spares_replace_failed=on, spares_cap=0.5)


async def lose_local_gpu(w: Failing, state: GpuHistory | None = LOST) -> None:
    text = NodeHealth(3, 86400, {"GPU-local": state}).to_annotation() if state else None
    patch = {"metadata": {"annotations": {HEALTH_ANNOTATION: text}}}
    await w.api.merge_patch("/api/v1/nodes/node-a", patch)


def spare_pool(w: Failing) -> list[str]:
    return sorted(
        d["name"]
        for s in w.api.objects("/apis/resource.k8s.io/v1/resourceslices")
        if s["spec"]["pool"]["name"] == SPARES
        for d in s["spec"].get("devices") or ()
    )


async def test_a_node_that_lost_a_local_gpu_is_given_a_spare_and_lets_it_go_once_back() -> None:
    w = Failing(gpus=2)
    rec = Reconciler(w.api, w.fabric, rules())
    async with running(rec):
        await w.changed.until("the first pool", lambda: bool(w.devices()))
        assert w.fabric.attached == []  # nothing lost: no spare
        before = replaced()
        await lose_local_gpu(w)
        await w.changed.until("a replacement", lambda: spare_pool(w) != [])
        assert replaced() == before + 1
        (name,) = spare_pool(w)
        assert name == variant_name("GPU-0", "node-a", "adapter0")
        assert "bindingConditions" not in w.devices()[name]
        assert len(w.fabric.attached) == 1  # one GPU lost, one spare
        await lose_local_gpu(w, None)  # the plugin's record went: the GPU is back
        await w.changed.until("released", lambda: w.fabric.detached == ["gpu-0"])


async def test_off_by_default_and_not_for_a_gpu_on_its_way_to_a_reset() -> None:
    w = Failing(gpus=2)
    rec = Reconciler(w.api, w.fabric, rules(on=False))
    async with running(rec):
        await lose_local_gpu(w)
        await w.changed.until("the pass", lambda: bool(w.devices()))
        await rec.publisher.in_sync.wait()
        rec.reconcile()
        assert rec.spares.last.attach == ()
    assert w.fabric.attached == []
    w = Failing(gpus=2)
    rec = Reconciler(w.api, w.fabric, rules())
    async with running(rec):
        await lose_local_gpu(w, GpuHistory("resetting", "reset", 48, "", LOST.since))
        await w.changed.until("the pass", lambda: bool(w.devices()))
        await rec.publisher.in_sync.wait()
        rec.reconcile()
        assert rec.spares.last.attach == ()
    assert w.fabric.attached == []


async def test_a_failed_fabric_gpu_is_replaced_once_and_a_taken_spare_is_not_replaced() -> None:
    w = Failing(gpus=3)
    rec = Reconciler(w.api, w.fabric, rules())
    noted(w, rec)
    async with running(rec):
        w.api.add(CLAIMS, claim("node-a"))
        await w.changed.until("the claim ready", lambda: condition(w, READY_CONDITION))
        w.failed = {"GPU-0": FAILURE}
        await w.report()
        await w.changed.until("detached", lambda: w.fabric.devices["gpu-0"].connection is None)
        await w.changed.until("a replacement", lambda: spare_pool(w) != [])
        (name,) = spare_pool(w)
        spare_id = next(i for i in ("gpu-1", "gpu-2") if name.startswith(
            variant_name(f"GPU-{i[-1]}", "node-a", "adapter0")))  # fmt: skip
        # A pod takes the replacement: the node has its GPU back, no new spare.
        taken = claim("node-a")
        taken["metadata"] |= {"name": "taken", "uid": "uid-2"}
        result = taken["status"]["allocation"]["devices"]["results"][0]
        result |= {"pool": SPARES, "device": name}
        del result["bindingConditions"], result["bindingFailureConditions"]
        w.api.add(CLAIMS, taken)
        await w.changed.until("taken", lambda: rec.spares.last.keep == ())
        assert rec.spares.last.attach == ()  # that pass's plan: no other spare
    attached = [a[0] for a in w.fabric.attached]
    assert attached == ["gpu-0", spare_id]  # the claim's, its replacement, nothing more


def test_the_model_of_a_replacement() -> None:
    """That of the spare the node has, else of the lost fabric GPU when a free
    one of it reaches the node, else of the first free GPU there."""
    inv = FabricInventory((), ())
    free = [Free("a", "gpu", "A100", (("n", "x"),)), Free("h", "gpu", "H100", (("n", "x"),)),
            Free("z", "gpu", "B200", (("m", "x"),))]  # fmt: skip
    assert replacements({"n": [""]}, inv, (), (), [], free) == {("n", "gpu", "A100"): 1}
    assert replacements({"n": ["H100", ""]}, inv, (), (), [], free) == {("n", "gpu", "H100"): 2}
    mine = [Spare("s", "gpu", MODEL, "n", "x", True, 0.0)]
    assert replacements({"n": ["H100"]}, inv, (), (), mine, free) == {("n", "gpu", MODEL): 1}
    assert replacements({"m": ["H100"], "q": [""]}, inv, (), (), [], free) == {
        ("m", "gpu", "B200"): 1
    }


def test_a_replacement_is_never_released_for_being_idle() -> None:
    rules = SpareRules(replace_failed=True, cap=1.0, idle_timeout=300.0)
    spare = Spare("s", "gpu", MODEL, "n", "x", True, 0.0)
    key = ("n", "gpu", MODEL)
    kept = plan(rules, [spare], [], 4, ["n"], {}, 1000.0, None, {key: 1})
    assert kept.keep == (spare,) and kept.retire == ()
    idle = SpareRules(demand={("gpu", MODEL): 1}, cap=1.0, idle_timeout=300.0)
    gone = plan(idle, [spare], [], 4, ["n"], {key: 900.0}, 1000.0)
    assert [r.why for r in gone.retire] == ["idle"]  # a demand spare would go
