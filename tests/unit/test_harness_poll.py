"""The harness's poll loop: what ends a wait, and what a timeout says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import poll


def answers(*values: object) -> Iterator[object]:
    yield from values
    while True:
        yield values[-1]


def test_wait_for_returns_the_first_done_answer() -> None:
    seq = answers(None, 0, "", "there")
    assert poll.wait_for("x", lambda: next(seq), timeout=60, interval=0) == "there"


def test_done_decides_what_counts_so_a_zero_answer_ends_the_wait() -> None:
    seq = answers(None, 0, 5)
    got = poll.wait_for("x", lambda: next(seq), 60, interval=0, done=lambda v: v is not None)
    assert got == 0


def test_a_timeout_names_what_was_awaited() -> None:
    # A negative timeout: the deadline has passed after the first probe, on any machine.
    with pytest.raises(poll.WaitTimedOut, match="waiting for the spare on node-c"):
        poll.wait_for("the spare on node-c", lambda: None, timeout=-1)


def test_until_gives_up_quietly_with_none() -> None:
    calls: list[int] = []
    assert poll.until(lambda: calls.append(1), timeout=-1) is None
    assert calls == [1]


def test_a_timed_out_wait_is_a_test_failure() -> None:
    assert issubclass(poll.WaitTimedOut, AssertionError)
