"""The ``Attempts of the job`` section of analyze's text report."""

from __future__ import annotations

from test_analysis_attempts import _job, _mark, _step

from monitor.analysis.attempts import job_ledger
from monitor.analysis.attempts_report import section
from monitor.analysis.cadence import cadence


def test_each_attempt_its_ending_the_jobs_ettr_and_each_failures_cost_are_shown():
    steps, events, flags = _job()
    led = job_ledger(steps, events, flags)
    text = section({"attempts": led, "cadence": cadence(led, steps, {"trainer": {
        "save_freq": 20}})})
    lines = text.splitlines()
    assert lines[0].startswith("  #1 ") and "steps 1-7; crash: oom: torch.OutOfMemoryError" \
        in lines[0]
    assert "steps 6-12 (2 redone), resumed from step 5; terminated" in lines[2]
    assert "hang 53 s" in lines[3]
    assert "ETTR 35.7%" in text and "failure #2 (terminated) cost 110 s" in text
    assert "Save more often: trainer.save_freq=3 instead of 20" in text


def test_a_missing_premise_is_named_instead_of_advice():
    steps, events, flags = _job()
    led = job_ledger(steps, events, flags)
    text = section({"attempts": led, "cadence": {"advice": None, "missing": ["no save"]}})
    assert "checkpoints: no cadence advice: no save" in text


def test_one_finished_attempt_is_no_section():
    steps = [_step(k, 100.0 + 12 * k) for k in range(1, 4)]
    led = job_ledger(steps, [_mark("attempt_start", 90.0), _mark("attempt_end", 140.0, 0)])
    assert section({"attempts": led}) is None
