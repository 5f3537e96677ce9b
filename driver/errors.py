"""The exception tree of patchbay, and the exit code each error ends a process with.

Why one module: every error we raise on purpose derives from
:class:`PatchbayError`, so a caller can tell our own failures (bad input, a
device in the wrong state) from bugs, and a process's exit code says which
kind of failure ended it (``driver.process``). Errors that wrap a
lower-level failure chain it with ``raise ... from exc`` so the cause is
never lost. The tree (exit code where an error ends a process)::

    PatchbayError                  1  a deliberate failure not named below
    ├── ConfigError                2  a setting, flag or configuration file
    │   └── SocketPathError        2  a kubelet socket path too long or taken
    ├── ClaimError                    a claim cannot be (un)prepared as asked
    ├── DeviceError                   a device missing, busy or in a bad state
    ├── NodeStateError                the plugin's own files on the node
    │   ├── CheckpointError           ... the checkpoint cannot be read or written
    │   └── CdiError                  ... a CDI spec cannot be written or removed
    ├── DiscoveryError             3  NVML or sysfs discovery failed
    │   ├── HotplugError           3  the hot-plug event source ended or failed
    │   └── NvmlError              3  an NVML call failed
    │       └── NvmlDeviceError       ... one that changes a device (also a DeviceError)
    ├── ApiError                   4  a Kubernetes API call failed
    │   └── ApiStatusError         4  ... with a non-success HTTP status
    ├── FabricError                   anything the fabric did or could not do
    │   ├── FabricApiError            the fabric service refused a request
    │   │   ├── FabricConflict        ... 409
    │   │   │   └── FabricAttachConflict  ... an attach refused: attached elsewhere
    │   │   ├── FabricAttachRefused   ... an attach request refused (4xx), by it or the client
    │   │   ├── FabricNotFound        ... 404
    │   │   └── CountAttachFailed     ... a count-based manager sent the wrong device or none
    │   ├── FabricUnavailable         the fabric service is unusable now (retry later)
    │   │   ├── FabricUnreachable     ... no answer: connection, timeout, TLS, redirect
    │   │   │   ├── FabricTlsError    ... its TLS certificate was refused
    │   │   │   └── FabricRedirectRefused  ... it redirected to another origin
    │   │   └── FabricResourceBroken  ... one resource broken (5xx, too large, missing)
    │   │       └── FabricMalformed   ... it answered a body of the wrong shape
    │   ├── AttachFailed              the fabric could not attach a device
    │   │   ├── AdapterFull           ... the node's adapter has no room for it
    │   │   └── SpareTaken            ... a warm spare's device is attached elsewhere
    │   └── fabric.service.errors.RedfishError
    │       │                         a request the simulated fabric refuses
    │       │                         (kept beside its Redfish renderer)
    │       └── fabric.service.count_wire.FmError
    │                                 ... on its count face (its own error body)
    ├── WireError                     a peer broke a wire protocol (an HPACK header
    │                                 block the plugin's HTTP/2 server cannot decode)
    ├── LeaseLost                  5  the controller is no longer the leader
    └── Stopped                    0  not a failure: SIGTERM ends a task group

The root holds one class per kind of failure a caller tells apart; a
feature's errors sit under its own (``FabricError``, ``NodeStateError``), so
``except FabricError`` is every way the fabric can fail a request.

An error without its own code ends a process with its nearest ancestor's.
A task group that fails raises an ``ExceptionGroup`` of the errors of its
tasks; :func:`leaves` flattens one so the exit code comes from the errors
inside (``driver.process.exit_status``).
"""

from __future__ import annotations

import contextlib
import json


class PatchbayError(Exception):
    """Base of every error patchbay raises deliberately."""

    exit_code = 1


class ConfigError(PatchbayError):
    """A setting, flag or opaque claim configuration is invalid."""

    exit_code = 2


class SocketPathError(ConfigError):
    """A socket path is too long or occupied by something that is not a socket."""


class ClaimError(PatchbayError):
    """A ResourceClaim cannot be prepared or unprepared as asked."""


class DeviceError(PatchbayError):
    """A device is missing, busy or in a state that forbids the operation."""


class NodeStateError(PatchbayError):
    """The plugin's own state on the node (its checkpoint, its CDI specs) failed."""


class CheckpointError(NodeStateError):
    """The plugin's checkpoint file cannot be read or written."""


class CdiError(NodeStateError):
    """A CDI spec cannot be written or removed."""


class DiscoveryError(PatchbayError):
    """Hardware discovery (NVML, sysfs) failed."""

    exit_code = 3


class HotplugError(DiscoveryError):
    """The hot-plug event source ended or failed; the plugin must restart."""


class NvmlError(DiscoveryError):
    """An NVML call failed; ``name`` is NVML's return code without its prefix.

    ``code`` is the numeric ``nvmlReturn_t`` (e.g. 15) and ``name`` its NVML
    name (e.g. ``"GPU_IS_LOST"``), so callers can branch on the cause the same
    way whether the in-memory fake or the real library raised it.
    """

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"NVML {name} ({code}): {message}")
        self.code = code
        self.name = name
        self.message = message


class NvmlDeviceError(NvmlError, DeviceError):
    """An NVML call that changes a device (MIG mode, MIG instances) failed."""


class ApiError(PatchbayError):
    """A Kubernetes API call failed in a way the caller must handle."""

    exit_code = 4


class ApiStatusError(ApiError):
    """The apiserver answered with a non-success HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        message = body
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message", body)
        super().__init__(f"{method} {path}: HTTP {status}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class FabricError(PatchbayError):
    """Anything the fabric did or could not do: a refused request, a service
    that cannot be used now, an attach that failed."""


class FabricApiError(FabricError):
    """The fabric service refused a request; ``code`` is the Redfish MessageId;
    ``method`` and ``uri`` the request, when known."""

    def __init__(
        self, status: int, code: str, message: str, method: str = "", uri: str = ""
    ) -> None:
        where = f" {method} {uri}" if method or uri else ""
        super().__init__(f"fabric{where}: HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.method = method
        self.uri = uri


class FabricConflict(FabricApiError):
    """409: the device is attached elsewhere, held by another tenant, busy or in use."""


class FabricAttachRefused(FabricApiError):
    """An attach request was refused: the manager answered it 4xx (other than 404
    and 409), or the client would not send it (what it would break is named)."""


class FabricAttachConflict(FabricConflict, FabricAttachRefused):
    """An attach refused because the device is attached to another host (409)."""


class CountAttachFailed(FabricApiError):
    """A count-based manager attached nothing, or something other than what was asked."""


class FabricNotFound(FabricApiError):
    """404: no such resource."""


class FabricUnavailable(FabricError):
    """The fabric service could not be reached or answered garbage (retry later)."""


class FabricUnreachable(FabricUnavailable):
    """The fabric manager did not answer: connection refused or reset, a timeout
    (named with its length), TLS refused, a redirect away from it."""


class FabricTlsError(FabricUnreachable):
    """The fabric's TLS certificate was refused (CA, host name, validity)."""


class FabricRedirectRefused(FabricUnreachable):
    """The fabric redirected a request to another origin (scheme, host or port):
    not followed, so no credential goes there; both origins are named."""


class FabricResourceBroken(FabricUnavailable):
    """One resource of the fabric could not be read: an error answer (5xx), a body
    over the size limit, a link to nothing; ``uri`` names it. The rest of the
    fabric may be fine: an inventory keeps what it could read."""

    def __init__(self, message: str, uri: str = "") -> None:
        super().__init__(message)
        self.uri = uri


class FabricMalformed(FabricResourceBroken):
    """The fabric answered a body that is not JSON or lacks or mistypes a field."""


class AttachFailed(FabricError):
    """The fabric could not attach the device (task failed, foreign owner, timeout)."""


class AdapterFull(AttachFailed):
    """The node's fabric adapter has no room for another device: not the device's fault."""


class SpareTaken(AttachFailed):
    """A warm spare's device turned out attached elsewhere: not a failure of the device."""


class WireError(PatchbayError):
    """A peer sent what a wire protocol forbids: the connection ends with
    ``code``, the protocol's own error (``plugin.servers.h2headers``: HTTP/2's
    PROTOCOL_ERROR or COMPRESSION_ERROR)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class LeaseLost(PatchbayError):
    """This controller replica is no longer the leader; it restarts as a follower."""

    exit_code = 5


class Stopped(PatchbayError):
    """Not a failure: raised inside a task group to end it after SIGTERM/SIGINT."""

    exit_code = 0


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, nested exception groups flattened, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]
