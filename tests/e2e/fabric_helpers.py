"""Helpers of the fabric e2e tests: reading the fabric pool, pods and claims.

Split from tests/e2e/test_fabric_e2e.py to keep each module small.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from driver.controller.pool.domains import LABEL_PREFIX as REACH_LABEL
from driver.fabric_devices.naming import in_fabric_pool, is_adapter_pool
from driver.faults import ENV
from tests.e2e import pods
from tests.e2e.helpers import wait_for
from tests.harness.fabricsim import ControllerProcess, FabricService, switch
from tests.harness.simnode import SimNode

ROOT = "resource.kubernetes.io/pcieRoot"
ADAPTERS = "--fabric-adapters=adapter0=0000:15:02.0,adapter1=0000:85:01.0"
HOLD_S = 45  # the controller's --failed-device-hold
LEASE_S = 6  # short leader lease: a standby takes over within seconds
DIALECTS = ("connections", "zones")  # the controller's --fabric-dialect values


@dataclass(frozen=True)
class SwitchLayout:
    """A switch wired to ``adapter`` of every node, and the devices in its slots."""

    id: str
    adapter: str
    gpus: tuple[str, ...] = ()
    nics: tuple[str, ...] = ()
    nvmes: tuple[str, ...] = ()
    cxlmems: tuple[str, ...] = ()
    wired: tuple[int, ...] = ()  # the indexes of the nodes wired to it (none: every node)
    lds: int = 1  # above 1: each CXL memory device an MLD of that many LDs (<id>-ld<k>)
    room: int | None = None  # devices each node's adapter can take (vPPBs; none: no limit)

    @property
    def devices(self) -> tuple[str, ...]:
        """The fabric's devices (endpoints): an MLD's LDs each."""
        mems = self.cxlmems
        if self.lds > 1:
            mems = tuple(f"{m}-ld{k}" for m in mems for k in range(self.lds))
        return self.gpus + self.nics + self.nvmes + mems

    def nodes(self, nodes: list[SimNode]) -> list[SimNode]:
        return [n for i, n in enumerate(nodes) if not self.wired or i in self.wired]


@dataclass(frozen=True)
class FabricLayout:
    """What the env's fabric holds (a module overrides the ``fabric_layout``
    fixture for other devices); CXL memory needs ``type="CXL"``."""

    switches: tuple[SwitchLayout, ...]
    type: str = "PCIe"

    def pool_size(self, nodes: int) -> int:
        """Pool variants: each device once per node its switch reaches."""
        return sum(len(sw.devices) * len(sw.wired or range(nodes)) for sw in self.switches)

    def devices(self) -> int:
        return sum(len(sw.devices) for sw in self.switches)

    def reach_labels(self, nodes: list[SimNode]) -> dict[str, dict[str, str]]:
        """The reach labels provisioning gives each node (docs/fabric.md, "Reach
        labels"): a switch of its own is a reach domain, ``<fabric>.<switch>``."""
        fabric = f"{self.type.lower()}0"
        out: dict[str, dict[str, str]] = {n.name: {} for n in nodes}
        for sw in self.switches:
            for n in sw.nodes(nodes):
                out[n.name][f"{REACH_LABEL}{fabric}.{sw.id}"] = ""
        return out

    def spec(self, nodes: list[SimNode]) -> dict[str, Any]:
        """The FabricService spec, wired to the nodes' simulated hosts."""
        switches = []
        for sw in self.switches:
            up = [(n.name, sw.adapter, n.host.dir) for n in sw.nodes(nodes)]
            switches.append(
                switch(sw.id, up, sw.gpus, sw.nics, sw.nvmes, sw.cxlmems, sw.lds, sw.room)
            )
        return {"id": f"{self.type.lower()}0", "type": self.type, "switches": switches}


# sw0: gpu-0, gpu-1 behind adapter0 of both nodes; sw1: gpu-2, nic-0 behind adapter1.
GPU_LAYOUT = FabricLayout(
    (
        SwitchLayout("sw0", "adapter0", gpus=("gpu-0", "gpu-1")),
        SwitchLayout("sw1", "adapter1", gpus=("gpu-2",), nics=("nic-0",)),
    )
)


class Env:
    def __init__(
        self,
        nodes: list[SimNode],
        fabric: FabricService,
        ctl: ControllerProcess,
        dialect: str = "connections",
        layout: FabricLayout = GPU_LAYOUT,
    ) -> None:
        self.nodes, self.fabric, self.ctl = nodes, fabric, ctl
        self.dialect, self.layout = dialect, layout
        self.per_domain = True  # each device published once (per-domain), or per node

    @property
    def pool_size(self) -> int:
        """Devices the fabric pool publishes when nothing is allocated."""
        if self.per_domain:
            return self.layout.devices()
        return self.layout.pool_size(len(self.nodes))

    def check_alive(self) -> bool:
        for n in self.nodes:
            n.check_alive()
        if not self.ctl.alive:
            raise RuntimeError(f"controller exited:\n{self.ctl.log_tail()}")
        return True


def fabric_slices(resource_api: client.ResourceV1Api) -> list[Any]:
    """The slices of the fabric pool and of its per-domain pools (``fabric/...``),
    not the nodes' adapter pools (``fabric/adapters/<node>``: no fabric device)."""
    items = resource_api.list_resource_slice(field_selector="spec.driver=patchbay.dev").items
    return [
        s
        for s in items
        if in_fabric_pool(s.spec.pool.name, "fabric")
        and not is_adapter_pool(s.spec.pool.name, "fabric")
    ]


def fabric_pool(resource_api: client.ResourceV1Api) -> dict[str, Any]:
    return {d.name: d for s in fabric_slices(resource_api) for d in (s.spec.devices or [])}


def attr(dev: Any, name: str) -> Any:
    a = dev.attributes[name]
    return a.string if a.string is not None else a.int


def template(
    resource_api: Any, ns: str, name: str, requests: list[dict[str, Any]], **extra: Any
) -> str:
    body = {
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests, **extra}}},
    }
    resource_api.create_namespaced_resource_claim_template(ns, body)
    return name


def gpu_request(name: str = "gpu", fabric_device: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.patchbay.dev"}
    if fabric_device:
        cel = f'device.attributes["patchbay.dev"].fabricDevice == "{fabric_device}"'
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def first_available(*devices: str) -> dict[str, Any]:
    """A GPU request for the first of fabric ``devices`` the scheduler can have."""
    subs = [
        {
            "name": d.replace("-", ""),
            "deviceClassName": "gpu.patchbay.dev",
            "selectors": [
                {"cel": {"expression": f'device.attributes["patchbay.dev"].fabricDevice == "{d}"'}}
            ],
        }
        for d in devices
    ]
    return {"name": "gpu", "firstAvailable": subs}


def pod_attaching(
    env: Env, resource_api: Any, core: Any, ns: str, name: str, device: str, node: str,
    latency: float,
) -> str:  # fmt: skip
    """A pod asking for fabric ``device`` on ``node``, waited for until its attach
    is under way (the fabric's attach latency set to ``latency`` first); its
    template name."""
    env.fabric.faults(attachLatencySeconds=latency)
    tmpl = template(resource_api, ns, name, [gpu_request(fabric_device=device)])
    pods.pod(core, ns, name, node, tmpl)
    wait_for(f"{device} attaching", lambda: device in env.fabric.connections(), timeout=60)
    return tmpl


def runs_with(
    env: Env, core: Any, ns: str, name: str, tmpl: str, node: str, device: str, adapter: str
) -> None:
    """A pod from ``tmpl`` on ``node`` runs with ``device`` attached through
    ``adapter``; then it is deleted and the device detached."""
    pods.pod(core, ns, name, node, tmpl)
    running(env, core, ns, name)
    assert env.fabric.connections()[device][:2] == (node, adapter)
    pods.gone(core, ns, name)
    wait_for(f"{device} detached", lambda: device not in env.fabric.connections(), timeout=60)


def kept_attached(env: Env, device: str, node: str, start: int, why: str) -> None:
    """Wait for a controller pass that would have detached ``device`` from
    ``node`` and logged that the detach waits (the node reports it busy);
    ``start``: the controller log's size before the release. Fails at once if
    the device is detached meanwhile."""
    waits = f"{device} still prepared on {node}: detach waits"

    def decided() -> bool:
        assert device in env.fabric.connections(), f"{device} detached while {why}"
        with env.ctl.log_path.open(encoding="utf-8", errors="replace") as log:
            log.seek(start)
            return waits in log.read()

    wait_for(f"a controller pass keeping {device} attached", decided, timeout=60)


def running(env: Env, core: Any, ns: str, name: str, timeout: float = 120) -> None:
    """Wait until the pod runs, failing at once if a node or the controller died."""
    pods.running(core, ns, name, timeout, alive=env.check_alive)


def running_on_device(
    env: Env, resource_api: Any, core: Any, ns: str, name: str, device: str, node: str
) -> None:
    """Pod ``name`` on ``node``, its claim (template ``name``) asking for the
    fabric ``device``, running."""
    tmpl = template(resource_api, ns, name, [gpu_request(fabric_device=device)])
    pods.pod(core, ns, name, node, tmpl)
    running(env, core, ns, name)


def detached(env: Env, device: str, once: str, timeout: float) -> None:
    """Wait until the fabric no longer connects ``device`` (``once``: what had
    to happen first, for the message), failing at once if something died."""
    wait_for(
        f"{device} detached once {once}",
        lambda: env.check_alive() and device not in env.fabric.connections(),
        timeout=timeout,
    )


def conditions(claim: Any, device: str) -> dict[str, str]:
    for d in claim.status.devices or []:
        if in_fabric_pool(d.pool, "fabric") and d.device == device:
            return {c.type: c.status for c in d.conditions or []}
    return {}


def detaches(env: Env, device: str) -> int:
    """Detach tasks this module's fabric started for ``device`` (its log, one
    line each; a new fabric's log holds only its own, tests/harness/fabricsim)."""
    said = env.fabric.log_path.read_text(errors="replace")
    return len(re.findall(rf"detach {re.escape(device)} from ", said))


def claim_gone_or_free(resource_api: Any, ns: str, name: str) -> bool:
    try:
        claim = resource_api.read_namespaced_resource_claim(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return claim.status is None or claim.status.allocation is None


def node_devices(resource_api: Any, node: str, kind: str) -> list[str]:
    slices = resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return sorted(d.name for s in slices for d in (s.spec.devices or []) if attr(d, "type") == kind)


def node_gpus(resource_api: Any, node: str) -> list[str]:
    return node_devices(resource_api, node, "gpu")


def node_vfs(resource_api: Any, node: str) -> list[str]:
    return node_devices(resource_api, node, "vf")


def restart(env: Env, identity: str, crash_point: str | None = None) -> None:
    """Kill the controller and start it again as ``identity``, to crash at
    ``crash_point`` (driver.faults) if one is given."""
    env.ctl.kill()
    env.ctl.env.pop(ENV, None)
    if crash_point is not None:
        env.ctl.env[ENV] = crash_point
    env.ctl.start(identity=identity)
