"""The text report: aligned tables, flags with evidence and advice, honest empty states."""

from __future__ import annotations

import pandas as pd

from monitor.analysis.summary import summarize
from monitor.records import Event, Flag, StepRecord
from monitor.report import render_text, scope_text, secs, table


def doc(steps, events=(), flags=(), attribution=None) -> dict:
    return {
        "log": "train.log",
        "format": "console",
        "version_guess": "0.7.1+",
        "parse": {"lines": 10, "parse_errors": 1},
        "summary": summarize(list(steps), list(events)),
        "flags": [f.to_dict() for f in flags],
        "attribution": attribution,
    }


def steps12() -> list[StepRecord]:
    return [
        StepRecord(step=i, end_time=1_767_225_600.0 + 60 * i, total=60.0,
                   phases={"gen": 40.0, "update_actor": 15.0,
                           "reshard": 12.0 if i == 9 else 1.5, "other": 3.5},
                   throughput=1500.0 - 10 * i)
        for i in range(1, 13)
    ]


def test_table_columns_line_up() -> None:
    text = table(["phase", "mean"], [["gen", "40.00 s"], ["update_actor", "5 s"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # right-aligned column ends together
    assert lines[1].strip().startswith("-----")


def test_report_sections_and_numbers() -> None:
    flag = Flag(kind="reshard_spike", severity="warning", start=1_767_226_140.0, end=None,
                scope={"phase": "reshard", "steps": [9, 9]},
                evidence="weight sync took 12.0 s vs a rolling median of 1.5 s",
                advice=["Lower actor_rollout_ref.rollout.gpu_memory_utilization."])
    text = render_text(doc(steps12(), flags=[flag]))
    assert "verl version guess 0.7.1+" in text
    assert "12 step records, step 1 .. 12" in text
    gen_row = next(line for line in text.splitlines() if line.strip().startswith("gen "))
    assert "40.00 s" in gen_row and "66.7%" in gen_row
    assert "1 spike(s)" in text
    # the spike table names step 9
    assert any(line.split()[:2] == ["9", "12.00"] for line in text.splitlines())
    assert "first quarter 1,480 -> last quarter 1,390" in text
    assert "[WARNING] reshard_spike  (phase reshard, step 9;" in text
    assert "evidence: weight sync took 12.0 s" in text
    assert "    - Lower actor_rollout_ref.rollout.gpu_memory_utilization." in text
    assert "GPU activity per phase" not in text  # no --gpu given


def test_report_empty_log_says_so() -> None:
    text = render_text(doc([]))
    assert "no training steps found in this log" in text
    assert "Flags (0)" in text and "none: no detector fired" in text


def test_report_attribution_names_the_lowest_gpu() -> None:
    rows = [
        {"phase": "gen", "node": "n0", "gpu": g, "util_mean": 40.0 if g == 3 else 92.0,
         "sm_mean": 70.0, "util_p10": 30.0, "sm_p10": 60.0, "steps": 5, "samples": 100}
        for g in range(8)
    ]
    text = render_text(doc(steps12(), attribution=rows))
    line = next(x for x in text.splitlines() if x.strip().startswith("gen ") and "n0:3" in x)
    assert "n0:3 40.0" in line and "52.0" in line  # spread 92 - 40


def test_report_events_lists_ooms() -> None:
    ev = [Event(kind="oom", time=1_767_225_700.0, step=2,
                message="torch.OutOfMemoryError: CUDA out of memory.")]
    text = render_text(doc(steps12(), events=ev))
    assert "oom 1" in text
    assert "2026-01-01 00:01:40 UTC  torch.OutOfMemoryError" in text


def test_helpers() -> None:
    assert secs(0.042) == "42 ms" and secs(12.345) == "12.35 s" and secs(4000) == "1h 06m"
    assert secs(None) == "-" and secs(float("nan")) == "-"
    assert scope_text({"node": "n0", "gpus": [3, 5], "phase": "gen", "steps": [1, 4]}) == (
        "node n0, GPUs 3,5, phase gen, steps 1-4"
    )


def test_report_shows_withheld_phases_with_reason_and_sample_count() -> None:
    from monitor.analysis.attribution import phase_summary

    # 'adv' had one sample wholly inside it per GPU over the steps: withheld, not dropped
    attrib = pd.DataFrame(
        [{"phase": p, "node": "n0", "gpu": g, "step": 1, "util_mean": u, "sm_mean": u - 5,
          "util_p10": u, "sm_p10": u, "samples": n, "full_samples": n, "seconds": float(n)}
         for g in range(2) for p, u, n in (("gen", 90.0, 40), ("adv", 8.0, 1))])
    rows = phase_summary(attrib, min_samples=3).to_dict("records")
    text = render_text(doc(steps12(), attribution=rows))
    lines = text.splitlines()
    adv = next(x for x in lines if x.strip().startswith("adv "))
    assert adv.split()[:4] == ["adv", "2", "1", "withheld"]
    gen = next(x for x in lines if x.strip().startswith("gen ") and "n0:" in x)
    assert gen.split()[:4] == ["gen", "2", "40", "90.0"]
    reason = next(x for x in lines if x.strip().startswith("adv withheld:"))
    assert "1 sample(s) wholly inside the phase, fewer than 3" in reason
