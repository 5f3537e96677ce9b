"""The admission check of our opaque configs: an AdmissionReview in, its answer out.

Why this module exists: a misspelt ``GpuConfig`` field was found only when
the pod was already bound and stuck on its node (the plugin's prepare
fails). The controller's webhook (``driver.controller.process.webhook``) asks this
module about every ResourceClaim and ResourceClaimTemplate created or
updated, and the apiserver refuses the object when one of its
``patchbay.dev`` configs does not decode. The decoding is the plugin's own
(:func:`driver.config.opaque.decode`, with every kind registered), so the
webhook and the plugin can never disagree on what is valid. What only the
allocation can tell (the device type a config lands on:
:func:`driver.config.opaque.effective`) stays the plugin's check, and the
webhook accepts such a config. Configs of other drivers are not looked at.

An UPDATE that leaves the spec as it was (the scheduler adding its
finalizer, a label) is allowed without decoding: a claim that got in while
the webhook was down must still be deletable and allocatable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import driver.vf.config  # noqa: F401  (registers VfConfig, like the plugin's VF family)
from driver import DRIVER_NAME
from driver.config import opaque
from driver.errors import ConfigError

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
GROUP = "resource.k8s.io"
# Where each kind keeps its DeviceClaim (spec.devices or, for a template, spec.spec.devices).
DEVICES_PATH: dict[str, tuple[str, ...]] = {
    "ResourceClaim": ("spec", "devices"),
    "ResourceClaimTemplate": ("spec", "spec", "devices"),
}
INVALID = 422  # the code and reason the apiserver's own validation answers with


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def config_problems(obj: Mapping[str, Any], kind: str) -> list[str]:
    """What is wrong with the ``patchbay.dev`` configs of a claim or template
    (kind ``kind``), one line per config; empty when all decode."""
    path = DEVICES_PATH[kind]
    configs = _at(obj, (*path, "config"))
    if not isinstance(configs, list):
        return []  # none (the apiserver has validated the shape)
    problems = []
    for index, entry in enumerate(configs):
        source = _at(entry, ("opaque",))
        if not isinstance(source, Mapping) or source.get("driver") != DRIVER_NAME:
            continue
        requests = ", ".join(str(r) for r in entry.get("requests") or ()) or "all"
        where = f"{'.'.join(path)}.config[{index}] (requests: {requests})"
        try:
            opaque.decode(source.get("parameters") or {}, where)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def verdict(request: Mapping[str, Any]) -> tuple[bool, str]:
    """Allowed or not, and why not, for one AdmissionRequest."""
    kind = _at(request, ("kind", "kind"))
    if _at(request, ("kind", "group")) != GROUP or kind not in DEVICES_PATH:
        return True, ""  # registered for something else by mistake: not ours to judge
    if request.get("subResource"):
        return True, ""
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return True, ""  # DELETE/CONNECT carry none
    if request.get("operation") == "UPDATE":
        old = request.get("oldObject")
        if isinstance(old, Mapping) and old.get("spec") == obj.get("spec"):
            return True, ""
    problems = config_problems(obj, str(kind))
    if not problems:
        return True, ""
    name = _at(obj, ("metadata", "name")) or _at(obj, ("metadata", "generateName")) or "?"
    return False, f"{kind} {request.get('namespace')}/{name}: " + "; ".join(problems)


def review(body: Any) -> dict[str, Any]:
    """The AdmissionReview answering ``body`` (a decoded AdmissionReview);
    :class:`ConfigError` if it is not one."""
    request = _at(body, ("request",))
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ConfigError("not an AdmissionReview: want an object with request.uid")
    allowed, message = verdict(request)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": allowed}
    if not allowed:
        response["status"] = {"code": INVALID, "reason": "Invalid", "message": message}
        log.info("refused %s %s: %s", request.get("operation"), request.get("name"), message)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
