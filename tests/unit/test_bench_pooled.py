"""Issue 36's figures across runs and rounds: the pooled p99 (the plugin
bench's runs joined before the percentile is taken, not the runs'
percentiles averaged) and the ratio's spread from round to round."""

from __future__ import annotations

from tests.bench.contenders import Contender, round_spread
from tests.bench.pooled import pool, report


def test_runs_are_joined_before_the_percentile() -> None:
    # Each run alone: ours p99 = its slowest but one; pooled, the slow pairs
    # of run 2 decide.
    run1 = {"ours": {"prepare_ms": [1.0] * 99 + [2.0], "unprepare_ms": [1.0] * 100},
            "ref": {"prepare_ms": [1.0] * 99 + [4.0], "unprepare_ms": [2.0] * 100}}  # fmt: skip
    run2 = {"ours": {"prepare_ms": [1.0] * 90 + [8.0] * 10, "unprepare_ms": [1.0] * 100},
            "ref": {"prepare_ms": [1.0] * 100, "unprepare_ms": [2.0] * 100}}  # fmt: skip
    pooled = pool([run1, run2])
    assert len(pooled["ours"]["prepare_ms"]) == 200
    lines = report([run1, run2]).splitlines()
    assert lines[0] == "2 runs pooled: ours 200 pairs, ref 200 pairs"
    assert "prepare p99: ours 8.00 ms, ref 1.00 ms; ours/ref 8.00" in lines
    assert "unprepare median: ours 1.00 ms, ref 2.00 ms; ours/ref 0.50" in lines


def test_round_spread_takes_the_ratio_round_by_round() -> None:
    # Ours twice as fast as ref in round 1, as fast in round 2, half as fast
    # in round 3: the whole run's medians would hide the rounds' swing.
    ours = Contender("ours", 0, "", "", "", "")
    ref = Contender("ref", 0, "", "", "", "")
    ours.prepare_ms = [1.0] * 4 + [2.0] * 4 + [4.0] * 4
    ref.prepare_ms = [2.0] * 4 + [2.0] * 4 + [2.0] * 4
    ours.unprepare_ms, ref.unprepare_ms = [1.0] * 12, [4.0] * 12
    lines = round_spread([ours, ref], ["ref"], 4).splitlines()
    assert lines[0].endswith("ours/ref 0.50 / 1.00 / 2.00")
    assert lines[1].endswith("ours/ref 0.25 / 0.25 / 0.25")
