"""The idle verdict over a window of utilization readings (driver.idle.window).

Times are the caller's monotonic clock, given as numbers: no sleeps."""

from __future__ import annotations

from driver.idle.window import IdlePolicy, UtilizationWindow, Verdict

POLICY = IdlePolicy(threshold=5.0, window=60.0)


def fed(readings: list[tuple[float, float | None]]) -> UtilizationWindow:
    w = UtilizationWindow(POLICY)
    for now, percent in readings:
        w.observe(now, percent)
    return w


def test_low_for_the_whole_window_is_idle_and_not_a_moment_before() -> None:
    w = fed([(t, 1.0) for t in range(0, 60, 10)])  # 0..50 s low
    assert w.verdict(50.0) is Verdict.ACTIVE
    assert w.low_for(50.0) == 50.0
    w.observe(60.0, 0.0)
    assert w.verdict(60.0) is Verdict.IDLE


def test_one_reading_at_the_threshold_starts_the_stretch_again() -> None:
    w = fed([(0.0, 1.0), (30.0, 5.0), (40.0, 1.0), (90.0, 1.0)])
    assert w.verdict(90.0) is Verdict.ACTIVE  # low since 40 s only
    assert w.low_for(90.0) == 50.0
    w.observe(100.0, 0.0)
    assert w.verdict(100.0) is Verdict.IDLE


def test_unknown_is_never_idle_and_ends_the_stretch() -> None:
    w = fed([(0.0, 0.0), (50.0, 0.0), (55.0, None)])
    assert w.verdict(70.0) is Verdict.UNKNOWN
    assert w.low_for(70.0) == 0.0
    w.observe(80.0, 0.0)
    assert w.verdict(80.0) is Verdict.ACTIVE  # counted again from 80 s
    assert w.verdict(140.0) is Verdict.IDLE


def test_nothing_read_yet_is_unknown_and_not_observed() -> None:
    w = UtilizationWindow(POLICY)
    assert not w.observed
    assert w.verdict(0.0) is Verdict.UNKNOWN
    assert w.latest is None and w.highest() is None


def test_the_window_keeps_the_last_readings_for_the_highest() -> None:
    w = fed([(0.0, 80.0), (40.0, 3.0), (70.0, 2.0), (95.0, 1.0)])
    assert w.highest() == 3.0  # 80 % at 0 s left the 60 s window
    assert w.latest == 1.0
