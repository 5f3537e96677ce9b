"""An idle node makes no slice writes, whatever GPU model it holds.

The apiserver stores quantities in canonical form (``81920Mi`` comes back as
``80Gi``); a plugin that compared what it wants with the stored copy literally
rewrote the pool of an A100 node forever (generations 1-4 within seconds,
then the publisher's backoff). Each model here publishes quantities that the
apiserver rewrites: A100-40GB and A100-80GB memory (whole GiB), and the MIG
partitions of an H200 (16384 and 143360 MiB, whole GiB as well). At rest the
pool stays at generation 1 and its slices keep their resourceVersion.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from fabric.simhost.topology import Gpu, RootComplex, RootPort, Topology
from tests.e2e.helpers import unchanged, wait_for
from tests.harness.cluster import LocalCluster
from tests.harness.simnode import PluginProcess
from tests.integration.own_node import own_node

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# (GPU model, extra plugin args, devices published for 2 GPUs)
MIG_PER_GPU = 1 + 7 + 1 + 4 + 3 + 2 + 1 + 1  # the full GPU and every placement offered
CASES = {
    "a100-40gb": ("A100-SXM4-40GB", (), 2),
    "a100-80gb": ("A100-SXM4-80GB", (), 2),
    "h200-mig": ("H200-SXM5-141GB", ("--mig-gpus=all",), 2 * MIG_PER_GPU),
}


def two_gpus(model: str) -> Topology:
    return Topology(
        f"2x-{model.lower()}",
        (
            RootComplex(
                0,
                0x3A,
                0,
                (
                    RootPort("0000:3a:01.0", Gpu("0000:3b:00.0", model)),
                    RootPort("0000:3a:02.0", Gpu("0000:3c:00.0", model)),
                ),
            ),
        ),
    )


@pytest.fixture(params=sorted(CASES))
def idle(
    request: pytest.FixtureRequest, local_cluster: LocalCluster, core: client.CoreV1Api
) -> Iterator[tuple[PluginProcess, int]]:
    model, args, count = CASES[request.param]
    with own_node(local_cluster, core, f"idle-{request.param}", two_gpus(model)) as node:
        yield node.plugin(*args).start(), count


def test_idle_node_does_not_rewrite_its_slices(
    idle: tuple[PluginProcess, int], resource_api: client.ResourceV1Api
) -> None:
    proc, count = idle
    selector = f"spec.nodeName={proc.node_name}"

    def slices() -> list[client.V1ResourceSlice]:
        return list(resource_api.list_resource_slice(field_selector=selector).items)

    def published() -> bool:
        assert proc.alive, f"plugin exited:\n{proc.log_tail()}"
        return sum(len(s.spec.devices or []) for s in slices()) == count

    wait_for(f"{count} devices published", published, timeout=60)
    listing = unchanged(resource_api.list_resource_slice, "the idle node's slices", 4,
                        field_selector=selector)  # fmt: skip
    assert {s.spec.pool.generation for s in listing.items} == {1}, "the pool was rewritten"
    assert proc.alive
