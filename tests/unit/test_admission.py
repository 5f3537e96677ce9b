"""The admission check of our opaque configs (driver.controller.process.admission):
an AdmissionReview in, its answer out, with the plugin's own decoder.

The served endpoint (TLS, certificate rotation) is checked in
tests/integration/test_webhook_tls.py, the registration with a real
apiserver in tests/e2e/test_webhook_e2e.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from driver.controller.process.admission import review
from driver.controller.process.settings import ControllerSettings
from driver.errors import ConfigError
from driver.settingsflags import parse_settings

GOOD = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "GpuConfig"}


def opaque(parameters: dict[str, Any], driver: str = "patchbay.dev", **entry: Any) -> Any:
    return {**entry, "opaque": {"driver": driver, "parameters": parameters}}


def claim(*configs: Any, name: str = "c") -> dict[str, Any]:
    devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.patchbay.dev"}}]}
    return {"metadata": {"name": name}, "spec": {"devices": {**devices, "config": list(configs)}}}


def template(*configs: Any) -> dict[str, Any]:
    return {"metadata": {"name": "t"}, "spec": {"spec": claim(*configs)["spec"]}}


def request(
    obj: Any, kind: str = "ResourceClaim", operation: str = "CREATE", **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "namespace": "team-a",
            "operation": operation,
            "object": obj,
            **extra,
        },
    }


def answer(body: dict[str, Any]) -> dict[str, Any]:
    out = review(body)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == body["request"]["uid"]
    return dict(out["response"])


def refused(body: dict[str, Any]) -> str:
    response = answer(body)
    assert response["allowed"] is False
    assert response["status"]["code"] == 422 and response["status"]["reason"] == "Invalid"
    return str(response["status"]["message"])


def test_an_unknown_gpuconfig_field_is_refused_naming_the_config_and_the_field() -> None:
    bad = opaque({**GOOD, "driverCapabilites": ["compute"]}, requests=["gpu"])
    message = refused(request(claim(opaque(GOOD), bad)))
    assert message.startswith("ResourceClaim team-a/c: spec.devices.config[1] (requests: gpu)")
    assert "invalid GpuConfig: field driverCapabilites: Extra inputs are not permitted" in message
    assert "config[0]" not in message  # the good one is not blamed


def test_a_template_is_checked_at_its_own_path() -> None:
    bad = opaque({**GOOD, "sharing": {"strategy": "MPS", "mpsConfig": {"bogus": 1}}})
    message = refused(request(template(bad), kind="ResourceClaimTemplate"))
    assert "ResourceClaimTemplate team-a/t: spec.spec.devices.config[0] (requests: all)" in message
    assert "field sharing.mpsConfig.bogus" in message


def test_every_bad_config_is_named_and_each_decoder_error_passes_through() -> None:
    wrong_version = opaque({**GOOD, "apiVersion": "patchbay.dev/v9"})
    unknown_kind = opaque({**GOOD, "kind": "TpuConfig"})
    out_of_range = opaque(
        {**GOOD, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}}
    )
    message = refused(request(claim(wrong_version, unknown_kind, out_of_range)))
    assert "config[0] (requests: all): apiVersion must be 'patchbay.dev/v1alpha1'" in message
    assert "config[1] (requests: all): unknown kind 'TpuConfig' (known: GpuConfig, VfConfig)" in (
        message
    )
    assert "config[2] (requests: all): invalid GpuConfig: field " in message
    assert "sharing.mpsConfig.defaultActiveThreadPercentage" in message


@pytest.mark.parametrize(
    "config",
    [
        opaque(GOOD),
        opaque({**GOOD, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}),
        # A VfConfig: the webhook knows every kind the plugin does.
        opaque({"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig", "mode": "vfio-pci"}),
        # Another driver's config is not ours to judge, however odd.
        opaque({"whatever": True}, driver="gpu.nvidia.com"),
    ],
    ids=["gpu", "timeslicing", "vf", "other-driver"],
)
def test_configs_that_decode_and_other_drivers_configs_are_allowed(config: Any) -> None:
    response = answer(request(claim(config)))
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_the_device_type_a_config_lands_on_stays_the_plugins_check() -> None:
    # A VfConfig on a GPU request decodes; only the allocation tells it does not fit.
    vf = opaque({"apiVersion": "patchbay.dev/v1alpha1", "kind": "VfConfig"}, requests=["gpu"])
    assert answer(request(claim(vf)))["allowed"] is True


def test_an_update_that_keeps_the_spec_is_allowed_even_with_a_bad_config() -> None:
    """The scheduler adding its finalizer to a claim that got in while the
    webhook was down: refusing it would block allocation and deletion."""
    bad = claim(opaque({**GOOD, "nope": 1}))
    finalized = copy.deepcopy(bad)
    finalized["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    assert answer(request(finalized, operation="UPDATE", oldObject=bad))["allowed"] is True
    changed = request(bad, operation="UPDATE", oldObject=claim(opaque(GOOD)))
    assert "field nope" in refused(changed)


def test_what_is_not_a_claim_or_template_spec_is_allowed() -> None:
    bad = claim(opaque({**GOOD, "nope": 1}))
    assert answer(request(bad, subResource="status"))["allowed"] is True
    assert answer(request(bad, kind="DeviceClass"))["allowed"] is True
    assert answer(request(None, operation="DELETE"))["allowed"] is True
    assert answer(request({"metadata": {"name": "c"}}))["allowed"] is True  # no spec at all


def test_a_body_that_is_not_an_admission_review_is_an_error() -> None:
    with pytest.raises(ConfigError, match="not an AdmissionReview"):
        review({"request": {"object": {}}})
    with pytest.raises(ConfigError, match="not an AdmissionReview"):
        review([])


def test_the_webhook_port_needs_its_certificate_and_key() -> None:
    base = ["--fabric-url=https://fabric:7080", "--fabric-token=t"]
    with pytest.raises(ConfigError, match="--webhook-port / WEBHOOK_PORT needs --webhook-tls-cert"):
        parse_settings(ControllerSettings, [*base, "--webhook-port=9443"], {})
    settings = parse_settings(
        ControllerSettings,
        base,
        {"WEBHOOK_PORT": "9443", "WEBHOOK_TLS_CERT": "/c", "WEBHOOK_TLS_KEY": "/k"},
    )
    assert settings.webhook_port == 9443 and str(settings.webhook_tls_key) == "/k"
    assert parse_settings(ControllerSettings, base, {}).webhook_port == 0  # off by default
