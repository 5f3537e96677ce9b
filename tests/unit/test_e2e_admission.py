"""The e2e modules' wait for an admission policy to be in force
(tests/e2e/admission.py): what it sends, what ends it, what fails it.

The calls here stand in for a Kubernetes client method and answer a
scripted sequence (admitted, or refused with a status and message), so each
rule is shown on its own; the cluster modules show it against the apiserver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import admission
from tests.harness.poll import WaitTimedOut


def refused(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="refused")
    err.body = json.dumps({"kind": "Status", "message": message})
    return err


class Call:
    """A client method answering ``answers`` in turn (an exception is raised),
    recording each call's arguments."""

    def __init__(self, *answers: Any) -> None:
        self.answers: Iterator[Any] = iter(answers)
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        answer = next(self.answers)
        if isinstance(answer, ApiException):
            raise answer
        return answer


def test_until_refused_sends_dry_runs_until_the_policys_message() -> None:
    call = Call({"kind": "admitted"}, refused(403, "RBAC: forbidden"), refused(422, "no: policy"))
    got = admission.until_refused("p", "policy", call, "ns", {"b": 1}, timeout=60)
    assert got == "no: policy"
    assert call.calls == [(("ns", {"b": 1}), {"dry_run": "All"})] * 3


def test_a_status_that_is_not_a_refusal_fails_at_once() -> None:
    call = Call(refused(500, "etcd down"), refused(422, "no: policy"))
    with pytest.raises(AssertionError, match="500 is not a refusal"):
        admission.until_refused("p", "policy", call, timeout=60)
    assert len(call.calls) == 1


def test_until_refused_names_the_last_answer_when_it_times_out() -> None:
    call = Call(refused(403, "RBAC: forbidden"))
    with pytest.raises(WaitTimedOut, match=r"p to refuse with 'policy'.*refused: RBAC: forbidden"):
        admission.until_refused("p", "policy", call, timeout=-1)


def test_until_admitted_retries_refusals_until_the_check_holds() -> None:
    call = Call(refused(500, "failed calling webhook"), {"holder": ""}, {"holder": "alice"})
    got = admission.until_admitted(
        "m", call, "ns", check=lambda obj: obj["holder"] == "alice", statuses=(500,), timeout=60
    )
    assert got == {"holder": "alice"}
    assert [kw for _, kw in call.calls] == [{"dry_run": "All"}] * 3


def test_until_admitted_fails_on_a_status_it_was_not_told_to_retry() -> None:
    call = Call(refused(422, "Invalid"), "made")
    with pytest.raises(ApiException):
        admission.until_admitted("m", call, statuses=(500,), timeout=60)
    assert len(call.calls) == 1


def test_refusal_reads_the_status_message_or_the_whole_body() -> None:
    assert admission.refusal(Call(refused(403, "denied: x"))) == "denied: x"
    plain = ApiException(status=400, reason="Bad Request")
    plain.body = "not json"
    assert admission.refusal(Call(plain)) == "not json"
    assert admission.refusal(Call("made")) == ""
