"""Backoff jitter (``driver.backoff``): retry loops that failed together spread out.

Why: when an apiserver outage ends, every node's watches re-list; with the
same delays they would all re-list at the same moment. The random source is
injected, so the test shows the spread without depending on chance or time.
"""

from __future__ import annotations

import random

import pytest

from driver.backoff import Backoff
from driver.kube import cache


def test_two_backoffs_that_fail_together_retry_apart() -> None:
    first = Backoff(0.2, 4.0, jitter=0.25, rand=random.Random(1).random)
    second = Backoff(0.2, 4.0, jitter=0.25, rand=random.Random(2).random)
    a = [first.next() for _ in range(8)]
    b = [second.next() for _ in range(8)]
    assert all(x != y for x, y in zip(a, b, strict=True))  # never in lockstep
    bases = [0.2, 0.4, 0.8, 1.6, 3.2, 4.0, 4.0, 4.0]  # doubling to the cap, as before
    for waits in (a, b):
        assert all(base <= w <= base * 1.25 for base, w in zip(bases, waits, strict=True))


def test_the_jitter_is_client_gos_wait_jitter() -> None:
    draws = iter([0.0, 0.5, 1.0])
    backoff = Backoff(1.0, 8.0, jitter=1.2, rand=lambda: next(draws))
    assert [backoff.next() for _ in range(3)] == [1.0, 2.0 * 1.6, 4.0 * 2.2]
    backoff.reset()
    assert backoff.delay == 1.0


def test_without_jitter_a_backoff_waits_its_base() -> None:
    backoff = Backoff(0.5, 2.0)
    assert [backoff.next() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]


def test_a_negative_jitter_is_refused() -> None:
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=-0.1)


def test_relists_wait_at_most_five_seconds_jitter_included() -> None:
    # The promise of driver.kube.cache: a watch is back within 5 s of an outage's end.
    assert cache.RELIST_CAP_S * (1 + cache.RELIST_JITTER) <= 5.0
    assert cache.RELIST_JITTER > 0
