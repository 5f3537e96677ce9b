"""Wait until an admission policy is in force, on what it does.

Why this module exists: the apiserver loads ValidatingAdmissionPolicies,
MutatingAdmissionPolicies, their bindings and params, and webhook
registrations through informers, so one just created takes effect a moment
later, each on its own time. A test that asserts a refusal right after
applying the policy passes on an idle machine and fails on a loaded one.
The e2e modules wait here, all one way: the request is sent as a dry run
(``dryRun=All``: nothing is written whatever the answer, so a probe let
through before the policy is loaded leaves nothing behind) until the
apiserver refuses it with the policy's message (:func:`until_refused`) or
admits it as the test needs (:func:`until_admitted`). :func:`refusal` is
the one way the modules read a refusal's message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

from kubernetes.client.exceptions import ApiException

from tests.harness.poll import WaitTimedOut, until

# Bad Request, Forbidden (a policy's Deny), Invalid (422): the statuses a
# refusal has; any other status is an error, not a refusal.
REFUSED = (400, 403, 422)


def message(err: ApiException) -> str:
    """The ``message`` of the apiserver's Status in ``err`` (its body if none)."""
    try:
        return str(json.loads(err.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(err.body)


def refusal(
    call: Callable[..., Any], *args: Any, statuses: Collection[int] = REFUSED, **kwargs: Any
) -> str:
    """The apiserver's message refusing ``call(*args, **kwargs)``; "" if it was
    admitted. A status outside ``statuses`` fails the test."""
    try:
        call(*args, **kwargs)
    except ApiException as err:
        assert err.status in statuses, f"{err.status} is not a refusal: {err.body}"
        return message(err)
    return ""


def until_refused(
    what: str, says: str, call: Callable[..., Any], *args: Any,
    statuses: Collection[int] = REFUSED, timeout: float = 60, **kwargs: Any,
) -> str:  # fmt: skip
    """Send ``call(*args, **kwargs)`` as a dry run until the apiserver refuses
    it with a message holding ``says`` (``what``: the policy, for a timeout's
    message); that message."""
    seen: list[str] = []

    def probe() -> bool:
        seen.append(refusal(call, *args, dry_run="All", statuses=statuses, **kwargs))
        return says in seen[-1]

    if until(probe, timeout) is None:
        last = f"refused: {seen[-1]}" if seen[-1] else "admitted"
        raise WaitTimedOut(f"timed out after {timeout:.0f}s waiting for {what} to refuse with "
                           f"{says!r}; the last dry run was {last}")  # fmt: skip
    return seen[-1]


def until_admitted(
    what: str, call: Callable[..., Any], *args: Any, check: Callable[[Any], bool] = bool,
    statuses: Collection[int] = REFUSED, timeout: float = 60, **kwargs: Any,
) -> Any:  # fmt: skip
    """Send ``call(*args, **kwargs)`` as a dry run until the apiserver admits
    it and ``check`` holds for the object it answers (a mutation applied);
    that object. A refusal with one of ``statuses`` is retried (the policy
    that refuses it not yet out of force), any other error fails."""
    seen: list[str] = []

    def probe() -> Any:
        try:
            obj = call(*args, dry_run="All", **kwargs)
        except ApiException as err:
            if err.status not in statuses:
                raise
            seen.append(f"refused: {message(err)}")
            return None
        seen.append(f"admitted as {obj}")
        return obj if check(obj) else None

    obj = until(probe, timeout, done=lambda o: o is not None)
    if obj is None:
        raise WaitTimedOut(f"timed out after {timeout:.0f}s waiting for {what}; "
                           f"the last dry run was {seen[-1]}")  # fmt: skip
    return obj
