"""Run statistics (monitor.analysis.summary) over hand-built step records."""

from __future__ import annotations

import json
import math

import pytest

from monitor.analysis.summary import (
    dp_imbalance_stats,
    long_tail_stats,
    phase_table,
    reshard_stats,
    step_overview,
    summarize,
    throughput_stats,
)
from monitor.records import Event, StepRecord


def step(n: int, **kw) -> StepRecord:
    kw.setdefault("end_time", 1000.0 + 10 * n)
    kw.setdefault("total", 10.0)
    kw.setdefault("phases", {"gen": 6.0, "update_actor": 3.0, "other": 1.0})
    return StepRecord(step=n, **kw)


def test_phase_table_stats_and_shares() -> None:
    steps = [step(i, phases={"gen": float(g), "update_actor": 3.0}) for i, g in
             enumerate([4, 5, 6, 7], start=1)]
    table = phase_table(steps)
    assert list(table.index) == ["gen", "update_actor"]  # verl's order, only phases seen
    gen = table.loc["gen"]
    assert gen["mean"] == 5.5 and gen["max"] == 7.0 and gen["p50"] == 5.5
    assert gen["p95"] == pytest.approx(6.85)
    assert gen["share"] == pytest.approx(22 / 40)
    assert table.loc["update_actor", "share"] == pytest.approx(12 / 40)
    assert table.loc["gen", "steps"] == 4


def test_phase_table_without_totals_uses_phase_sum() -> None:
    steps = [step(1, total=None, phases={"gen": 3.0, "reshard": 1.0})]
    table = phase_table(steps)
    assert table.loc["gen", "share"] == pytest.approx(0.75)
    assert phase_table([]).empty


def test_throughput_trend_first_vs_last_quarter() -> None:
    steps = [step(i, throughput=1000.0 if i <= 4 else 800.0) for i in range(1, 17)]
    t = throughput_stats(steps)
    assert t["first_quarter"] == 1000.0 and t["last_quarter"] == 800.0
    assert t["trend"] == pytest.approx(-0.2)
    assert throughput_stats(steps[:3])["trend"] is None


def test_reshard_spike_found_against_rolling_median() -> None:
    values = [1.0, 1.1, 0.9, 1.0, 1.0, 9.0, 1.0, 1.05, 1.2]
    steps = [step(i, phases={"reshard": v}) for i, v in enumerate(values, start=1)]
    r = reshard_stats(steps)
    assert r["median"] == 1.0 and r["max"] == 9.0
    assert [s["step"] for s in r["spikes"]] == [6]
    assert r["spikes"][0]["rolling_median"] == pytest.approx(1.0)
    steady = [step(i, phases={"reshard": 1.0 + 0.01 * i}) for i in range(20)]
    assert reshard_stats(steady)["spike_count"] == 0


def test_long_tail_prefers_agent_loop_then_response_length() -> None:
    agent = step(1, metrics={"timing_s/agent_loop/slowest/generate_sequences": 60.0,
                             "timing_s/agent_loop/generate_sequences/mean": 20.0,
                             "response_length/max": 100.0, "response_length/mean": 50.0})
    lt = long_tail_stats([agent])
    assert lt["source"] == "agent_loop" and lt["max"] == 3.0
    plain = step(2, metrics={"response_length/max": 3000.0, "response_length/mean": 1000.0})
    assert long_tail_stats([plain])["source"] == "response_length"
    assert long_tail_stats([plain])["median"] == 3.0
    assert long_tail_stats([step(3)])["source"] is None


def test_dp_imbalance() -> None:
    steps = [step(1, metrics={"global_seqlen/minmax_diff": 300, "global_seqlen/mean": 1000}),
             step(2, metrics={"global_seqlen/minmax_diff": 100, "global_seqlen/mean": 1000})]
    dp = dp_imbalance_stats(steps)
    assert dp["max"] == pytest.approx(0.3) and dp["mean"] == pytest.approx(0.2)


def test_overview_counts_resumes_and_span() -> None:
    steps = [step(1), step(2), step(3), step(2, end_time=2000.0), step(3, end_time=2010.0)]
    ov = step_overview(steps, [Event(kind="resume", time=1990.0, step=2)])
    assert ov["first"] == 1 and ov["last"] == 3 and ov["distinct"] == 3
    assert ov["resumes"] == 1
    assert ov["start_time"] == 1000.0 and ov["end_time"] == 2010.0


def test_summarize_is_strict_json_with_nan_inputs() -> None:
    steps = [step(i, throughput=float("nan"), metrics={"actor/lr": float("nan")},
                  phases={"gen": float("nan"), "reshard": 1.0}) for i in range(3)]
    events = [Event(kind="oom", time=5.0, step=1, message="CUDA out of memory.\nmore"),
              Event(kind="traceback", time=5.0, step=1,
                    message="Traceback (most recent call last):\n  x\nValueError: boom"),
              Event(kind="progress", time=6.0)]
    s = summarize(steps, events)
    text = json.dumps(s, allow_nan=False)  # raises on NaN
    assert "NaN" not in text
    assert s["throughput"]["count"] == 0
    assert s["events"]["counts"] == {"oom": 1, "traceback": 1, "progress": 1}
    messages = [e["message"] for e in s["events"]["listed"]]
    assert messages == ["CUDA out of memory.", "ValueError: boom"]  # traceback: last line
    assert [p["phase"] for p in s["phases"]] == ["reshard"]
    assert isinstance(s["phases"][0]["steps"], int)


def test_summarize_empty() -> None:
    s = summarize([], [])
    assert s["steps"]["count"] == 0 and s["phases"] == []
    assert s["step_time"]["mean"] is None and not math.isnan(s["steps"]["distinct"])
