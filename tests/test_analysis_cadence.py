"""Checkpoint cadence (Young/Daly) from the job's own numbers, against a hand computation."""

from __future__ import annotations

import math

import pytest
from test_analysis_attempts import _job, _mark, _step

from monitor.analysis.attempts import job_ledger
from monitor.analysis.cadence import cadence, save_freq


def _config(freq: int) -> dict:
    return {"trainer": {"save_freq": freq, "resume_mode": "auto"}}


def test_the_interval_that_loses_least_is_young_daly_on_the_jobs_numbers():
    steps, events, flags = _job()
    c = cadence(job_ledger(steps, events, flags), steps, _config(5))
    # by hand: 3 saves of 3 s; 2 failures over 116 + 165 + 95 s of attempts; 12 s a step
    mtbf = (116.0 + 165.0 + 95.0) / 2
    tau = math.sqrt(2 * 3.0 * mtbf)
    assert (c["save_cost_s"], c["saves_seen"], c["mtbf_s"], c["step_s"]) == (3.0, 3, mtbf, 12.0)
    assert c["interval_s"] == pytest.approx(tau, abs=1e-3)
    assert c["interval_steps"] == round(tau / 12.0) == 3
    assert c["expected_loss"]["now"] == pytest.approx(3 / 60 + 60 / (2 * mtbf), abs=1e-4)
    assert c["expected_loss"]["best"] == pytest.approx(3 / tau + tau / (2 * mtbf), abs=1e-4)
    assert c["save_freq"] == 5 and "no change needed" in c["advice"]
    assert [f["seconds"] for f in c["failure_costs"]] == [70.0, 110.0]


def test_a_job_saving_far_too_seldom_is_told_the_save_freq_to_set():
    steps, events, flags = _job()
    c = cadence(job_ledger(steps, events, flags), steps, _config(20))
    assert c["advice"].startswith("Save more often: trainer.save_freq=3 instead of 20")
    assert "sqrt(2 x save 3.0 s x MTBF 3.1 min)" in c["advice"]


def test_without_a_failure_or_a_given_rate_there_is_no_advice_and_it_says_why():
    steps = [_step(k, 100.0 + 12 * k, 3.0 if k % 5 == 0 else 0.0) for k in range(1, 11)]
    events = [_mark("attempt_start", 90.0), _mark("attempt_end", 250.0, 0)]
    c = cadence(job_ledger(steps, events), steps, _config(5))
    assert c["advice"] is None and c["interval_steps"] is None
    assert c["missing"] and "no failure seen" in c["missing"][0]
    given = cadence(job_ledger(steps, events), steps, _config(5), mtbf_s=4 * 3600.0)
    assert given["mtbf_source"] == "given"
    assert given["interval_steps"] == round(math.sqrt(2 * 3.0 * 4 * 3600.0) / 12.0)


def test_without_the_save_timer_the_cost_is_the_wall_time_a_save_step_takes_beyond_a_plain_one():
    # no timing_s/save_checkpoint: step 4 and 8 (save_freq 4) take 20 s more between lines
    ends, t = [], 100.0
    for k in range(1, 10):
        t += 12.0 + (20.0 if k % 4 == 0 else 0.0)
        ends.append(t)
    steps = [_step(k, ends[k - 1]) for k in range(1, 10)]
    events = [_mark("attempt_start", 80.0), _mark("attempt_end", ends[-1] + 1, 1)]
    c = cadence(job_ledger(steps, events), steps, _config(4))
    assert c["save_cost_s"] == pytest.approx(20.0) and "beyond a plain one" in \
        c["save_cost_source"]
    assert c["step_s"] == pytest.approx(12.0)


def test_a_job_that_saves_nothing_has_no_save_cost_to_reason_from():
    steps = [_step(k, 100.0 + 12 * k) for k in range(1, 5)]
    events = [_mark("attempt_start", 90.0), _mark("attempt_end", 160.0, 1)]
    c = cadence(job_ledger(steps, events), steps, _config(-1))
    assert c["advice"] is None and "no checkpoint save seen" in c["missing"][0]


def test_save_freq_is_read_from_the_printed_config_only():
    assert save_freq({"trainer": {"save_freq": 50}}) == 50
    assert save_freq(None) is None and save_freq({"trainer": {}}) is None
