"""Device metadata files (KEP-5304): what a container learns of its devices.

Why this module exists: nothing in the kubelet or the apiserver writes these
files; a Go driver gets them from ``k8s.io/dynamic-resource-allocation``
(``kubeletplugin/metadata.go``), a Python driver builds them itself. This is
the format, exactly as v0.37.2 of that library defines it
(``api/metadata``): per claim request and driver, one file, a JSON stream of
``DeviceMetadata`` objects of group ``metadata.resource.k8s.io``, the same
data once per version, newest first (``v1beta1``, then ``v1alpha1``, which the
library still writes for consumers not yet updated). Each object holds the
claim's name, namespace, UID and generation 1, ``podClaimName`` (the claim's
``resource.kubernetes.io/pod-claim-name`` annotation: a claim made from a
template), and the request with its devices: driver, pool, name, the
attributes the device is published with in its ResourceSlice (a PCI device's
include ``resource.kubernetes.io/pciBusID``) and network data where known.

The container sees the file at
``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``,
or ``.../resourceclaimtemplates/<podClaimName>/...`` for a template's claim.
The bytes are those the Go library writes (its JSON encoder, two-space indent,
``<>&`` escaped; ``tests/unit/test_metadata_go.py`` compares them with a file
written by the library itself). The files on the host, and the CDI device
that mounts each, are :mod:`driver.claims.metadata_files`'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver import DRIVER_NAME
from driver.devices.model import TYPE, Device, attribute_json
from driver.errors import ClaimError

GROUP = "metadata.resource.k8s.io"
KIND = "DeviceMetadata"
VERSIONS = ("v1beta1", "v1alpha1")  # written in this order: newest first
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# What Go's encoding/json escapes that Python's json (ensure_ascii off) does not.
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
_GO_ESCAPES |= {"\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_ESCAPE = re.compile("[<>&\u2028\u2029]")


@dataclass(frozen=True)
class MetadataDevice:
    """One device of a request, as its metadata file describes it."""

    pool: str
    name: str
    attributes: Mapping[str, Any] = field(default_factory=dict)  # name -> API value
    network_data: Mapping[str, Any] | None = None  # NetworkDeviceData, API shape
    driver: str = DRIVER_NAME

    @classmethod
    def of(
        cls, pool: str, device: Device, network: Mapping[str, Any] | None = None
    ) -> MetadataDevice:
        """A device with the attributes its ResourceSlice publishes (``type``
        too); without network data, the one made before for the same
        :class:`Device` value (discovery replaces a device, never changes it),
        so its text is rendered once (:func:`_device_text`)."""
        kept = _MADE.get((pool, id(device))) if network is None else None
        if kept is not None and kept[0] is device:  # the cache holds it: its id is not reused
            return kept[1]
        attrs = dict(device.attributes)
        attrs.setdefault(TYPE, device.kind)
        made = cls(pool, device.name, {k: attribute_json(v) for k, v in attrs.items()}, network)
        if network is None:
            if len(_MADE) >= _CACHE_MAX:
                _MADE.clear()
            _MADE[(pool, id(device))] = (device, made)
        return made

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool, "name": self.name}
        if self.attributes:
            out["attributes"] = {k: self.attributes[k] for k in sorted(self.attributes)}
        if self.network_data is not None:
            out["networkData"] = dict(self.network_data)
        return out


@dataclass(frozen=True)
class ClaimIdentity:
    """What a metadata file says of its claim."""

    namespace: str
    name: str
    uid: str
    pod_claim_name: str | None = None

    @classmethod
    def of(cls, claim: Mapping[str, Any], uid: str) -> ClaimIdentity:
        """From the claim object read at prepare; ClaimError naming the field
        when its pod-claim-name annotation cannot be a path component."""
        meta = claim.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        pod_claim_name = annotations.get(POD_CLAIM_NAME_ANNOTATION)
        if pod_claim_name is not None and not (
            isinstance(pod_claim_name, str) and _DNS_LABEL.fullmatch(pod_claim_name)
        ):
            raise ClaimError(
                f"claim {meta.get('namespace')}/{meta.get('name')}: metadata.annotations"
                f"[{POD_CLAIM_NAME_ANNOTATION}] must be a DNS label, got {pod_claim_name!r}"
            )
        return cls(str(meta.get("namespace")), str(meta.get("name")), uid, pod_claim_name)


def base_request(request: str) -> str:
    """``gpu/large`` (a subrequest) -> ``gpu``: the file is named by the request."""
    base = request.split("/", 1)[0]
    if not _DNS_LABEL.fullmatch(base):
        raise ClaimError(f"request name {request!r} is not a DNS label")
    return base


def container_path(claim: ClaimIdentity, request: str, driver: str = DRIVER_NAME) -> str:
    """Where the container finds the file of ``request`` (a base request name)."""
    if claim.pod_claim_name:
        where = f"{TEMPLATES_SUBDIR}/{claim.pod_claim_name}"
    else:
        where = f"{CLAIMS_SUBDIR}/{claim.name}"
    return f"{CONTAINER_DIR}/{where}/{request}/{driver}{FILE_SUFFIX}"


def document(
    claim: ClaimIdentity, request: str, devices: Sequence[MetadataDevice], version: str
) -> dict[str, Any]:
    """One ``DeviceMetadata`` object (``request`` as allocated: may name a
    subrequest); :func:`stream` writes the same from a template."""
    out: dict[str, Any] = {
        "kind": KIND,
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "generation": 1,
        },
    }
    if claim.pod_claim_name is not None:
        out["podClaimName"] = claim.pod_claim_name
    entry: dict[str, Any] = {"name": request}
    if devices:
        entry["devices"] = [d.to_json() for d in devices]
    out["requests"] = [entry]
    return out


# Scalars and keys through the C encoder: with ``indent`` set, ``json.dumps``
# takes the pure-Python encoder for the whole value, a third of the plugin's
# own work per prepare (docs/figures.md, the plugin's hot path).
_STRING = json.encoder.encode_basestring  # the C one where built, as json.dumps uses
_OTHER = json.JSONEncoder(ensure_ascii=False).encode
_CONSTANTS = {True: "true", False: "false", None: "null"}


def _indented(value: Any, pad: str, out: list[str]) -> None:
    """``value`` as ``json.dumps(value, indent=2, ensure_ascii=False)``
    writes it, appended to ``out`` (``pad``: the current line's indent)."""
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner, sep = pad + "  ", "{\n"
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"key {key!r}")  # json.dumps coerces it
            out += (sep, inner, _STRING(key), ": ")
            _indented(item, inner, out)
            sep = ",\n"
        out += ("\n", pad, "}")
    elif isinstance(value, list | tuple):
        if not value:
            out.append("[]")
            return
        inner, sep = pad + "  ", "[\n"
        for item in value:
            out += (sep, inner)
            _indented(item, inner, out)
            sep = ",\n"
        out += ("\n", pad, "]")
    elif isinstance(value, str):
        out.append(_STRING(value))
    elif value is None or isinstance(value, bool):
        out.append(_CONSTANTS[value])
    elif type(value) is int:
        out.append(int.__repr__(value))
    else:
        out.append(_OTHER(value))


_CACHE_MAX = 4096  # devices (and indents) kept per cache; then it starts over
# (pool, id(Device)) -> the device and what MetadataDevice.of made of it.
_MADE: dict[tuple[str, int], tuple[Device, MetadataDevice]] = {}
# (indent, id(MetadataDevice)) -> the device and its text at that indent.
_TEXTS: dict[tuple[str, int], tuple[MetadataDevice, str]] = {}


def _device_text(device: MetadataDevice, pad: str) -> str:
    """``device.to_json()`` as :func:`_indented` writes it at ``pad``, from
    the cache when the same device was written before: a node has a few
    devices, every prepare writes some of them again, and
    :meth:`MetadataDevice.of` hands out the same one for the same device (the
    rendering was a tenth of the plugin's own work per prepare;
    docs/figures.md). Network data (a VF's addresses, per claim) is not
    cached."""
    if (kept := _TEXTS.get((pad, id(device)))) is not None and kept[0] is device:
        return kept[1]
    out: list[str] = []
    _indented(device.to_json(), pad, out)
    text = "".join(out)
    if device.network_data is None:
        if len(_TEXTS) >= _CACHE_MAX:
            _TEXTS.clear()
        _TEXTS[(pad, id(device))] = (device, text)
    return text


def _go_text(value: Any) -> str:
    """:func:`go_json` without its fallback: TypeError where a key or a value
    is not what ``_indented`` writes."""
    out: list[str] = []
    _indented(value, "", out)
    return _GO_ESCAPE.sub(lambda m: _GO_ESCAPES[m.group()], "".join(out))


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.MarshalIndent(v, "", "  ")`` writes it."""
    try:
        return _go_text(value)
    except TypeError:  # a key to coerce, or a value json.dumps refuses too
        text = json.dumps(value, indent=2, ensure_ascii=False)
    return _GO_ESCAPE.sub(lambda m: _GO_ESCAPES[m.group()], text)


# The object of VERSIONS[0] up to its metadata's name: the same in every file.
_HEAD = f'{{\n  "kind": "{KIND}",\n  "apiVersion": "{GROUP}/{VERSIONS[0]}",\n  "metadata": {{\n'
_DEVICE_PAD = " " * 8  # a device's indent in requests[0].devices


def _newest_text(claim: ClaimIdentity, request: str, devices: Sequence[MetadataDevice]) -> str:
    """``_go_text(document(claim, request, devices, VERSIONS[0]))``, written
    from a template around the claim's strings and the devices' cached texts:
    the whole object through :func:`_indented` was most of the file's cost.
    TypeError where a value is not what ``_indented`` writes."""
    text = _STRING
    parts = [
        _HEAD,
        '    "name": ', text(claim.name),
        ',\n    "namespace": ', text(claim.namespace),
        ',\n    "uid": ', text(claim.uid),
        ',\n    "generation": 1\n  }',
    ]  # fmt: skip
    if claim.pod_claim_name is not None:
        parts += (',\n  "podClaimName": ', text(claim.pod_claim_name))
    parts += (',\n  "requests": [\n    {\n      "name": ', text(request))
    if devices:
        sep = ',\n      "devices": [\n' + _DEVICE_PAD
        for device in devices:
            parts += (sep, _device_text(device, _DEVICE_PAD))
            sep = ",\n" + _DEVICE_PAD
        parts.append("\n      ]")
    parts.append("\n    }\n  ]\n}")
    return _GO_ESCAPE.sub(lambda m: _GO_ESCAPES[m.group()], "".join(parts))


def stream(claim: ClaimIdentity, request: str, devices: Sequence[MetadataDevice]) -> bytes:
    """The file's content: one object per version, each ended by a newline.

    The versions differ only in ``apiVersion``, the object's second line:
    encoded once, the other
    versions are that text with the line swapped (no value can hold the
    line: its quotes would be escaped)."""
    try:
        newest = _newest_text(claim, request, devices)
    except TypeError:
        newest = go_json(document(claim, request, devices, VERSIONS[0]))
    line = f'"apiVersion": "{GROUP}/{VERSIONS[0]}"'
    others = [newest.replace(line, f'"apiVersion": "{GROUP}/{v}"', 1) for v in VERSIONS[1:]]
    return "".join(t + "\n" for t in (newest, *others)).encode()


def read_stream(data: bytes) -> list[dict[str, Any]]:
    """Every object of a metadata file, in order (what a consumer walks to
    find the first version it understands)."""
    text, out, at = data.decode(), [], 0
    decoder = json.JSONDecoder()
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        obj, at = decoder.raw_decode(text, at)
        out.append(obj)
    return out
