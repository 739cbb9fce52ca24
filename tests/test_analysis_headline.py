"""The headline every surface leads with (monitor/analysis/headline.py): the banner speaks for
the detectors, names the loss as information when none is open, the flag to act on first when
some are, a hang alone, and a finished run as finished (issue 38 items 1 and 2)."""

from __future__ import annotations

import pandas as pd
import pytest

from monitor.analysis.goodput import CAUSES, LEDGER_COLUMNS
from monitor.analysis.headline import (
    RunEnd,
    cause_seconds,
    headline,
    last_steps,
    rank_open,
)
from monitor.records import Flag

#: a span of 1,000 GPU-seconds: 70% productive, the rest lost to three causes
SECONDS = {"productive": 700.0, "weight_sync": 50.0, "straggler_wait": 150.0,
           "low_activity": 100.0}


def _flag(kind: str, severity: str = "warning", start: float = 100.0, end=None) -> Flag:
    return Flag(kind=kind, severity=severity, start=start, end=end, scope={},
                evidence=f"{kind} evidence", advice=[f"{kind} advice"])


def test_no_open_flag_is_healthy_and_the_loss_is_information_never_advice():
    """The README's one-node example ended in a yellow "No open flag, but goodput is 68% ...
    raise actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" while analyze said no detector
    fired: no flag is healthy, whatever the goodput."""
    head = headline({"productive": 300.0, "low_activity": 700.0}, [])
    assert head.state == "healthy" and head.text.startswith("Healthy: no open flag")
    assert head.goodput == pytest.approx(0.3)
    assert head.top_loss == "low_activity" and "for information" in head.text
    assert "micro_batch" not in head.text and head.top_flag is None
    # a closed flag and an info note are no open problem
    head = headline(SECONDS, [_flag("io_starvation", end=200.0), _flag("x", "info")])
    assert head.state == "healthy" and head.open_flags == 0


def test_open_flags_name_the_one_to_act_on_first_with_its_share():
    flags = [_flag("reshard_spike", start=300.0), _flag("gpu_imbalance", start=200.0)]
    head = headline(SECONDS, flags)
    assert head.state == "warning" and head.top_flag.kind == "gpu_imbalance"  # 15% > 5%
    assert head.top_flag_share == pytest.approx(0.15)
    assert head.text.startswith("Needs attention: 2 open flags (2 warning); top problem: "
                                "gpu_imbalance, 15% of the GPU time of the last 20 steps.")
    # the top loss is the bar's largest lost segment, and the flag that names it
    assert head.top_loss == "straggler_wait" and head.flagged_as == "gpu_imbalance"
    # severity comes first; the critical flag makes the banner red
    head = headline(SECONDS, [*flags, _flag("oom", "critical", start=50.0)])
    assert head.state == "critical" and head.top_flag.kind == "oom"


def test_a_hang_replaces_every_other_flag_and_advice():
    flags = [_flag("rollout_long_tail", "critical", start=300.0),
             _flag("hang", "critical", start=400.0), _flag("gpu_imbalance")]
    head = headline(SECONDS, flags)
    assert head.hang and head.top_flag.kind == "hang" and head.state == "critical"
    assert "hung" in head.text and "gpu_imbalance" not in head.text
    assert head.flagged_as is None  # no other flag's advice beside the hang's


def test_a_finished_run_says_finished_with_its_end_and_last_step():
    end = RunEnd(1_790_000_000.0, 42, "the job exited with status 0")
    head = headline(SECONDS, [_flag("gpu_imbalance")], span="the run", finished=end)
    assert head.state == "finished" and head.top_flag is None
    assert head.text.startswith("Finished at 2026-09-21 ") and "after step 42" in head.text
    assert "Over the run, goodput was 70%" in head.text
    assert head.to_json()["finished"] == {"time": end.time, "step": 42,
                                          "reason": "the job exited with status 0"}


def test_a_cause_before_the_flags_it_explains():
    """``suppress``: a straggler explains its waiting peers' low activity; it comes first."""
    waiting = _flag("low_utilization", start=500.0)
    straggler = _flag("gpu_imbalance", start=100.0)
    ranked = rank_open([waiting, straggler], {"productive": 800.0, "low_activity": 100.0,
                                              "straggler_wait": 100.0},
                       {"low_utilization": ["gpu_imbalance"]})
    assert [f.kind for f, _ in ranked] == ["gpu_imbalance", "low_utilization"]


def test_no_ledger_yet_gives_the_flags_without_numbers():
    head = headline(None, [])
    assert head.state == "healthy" and head.goodput is None and head.text == (
        "Healthy: no open flag; every detector is quiet.")


def test_the_span_is_the_last_steps_of_the_ledger():
    rows = []
    for step in range(1, 31):
        for gpu in (0, 1):
            row = dict.fromkeys(LEDGER_COLUMNS, 0.0)
            row.update(step=step, node="n", gpu=gpu, start=10.0 * step - 10, end=10.0 * step,
                       tail=False, wall=10.0, productive=10.0 if step > 10 else 5.0,
                       low_activity=0.0 if step > 10 else 5.0)
            rows.append(row)
    led = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    recent = last_steps(led, 20)
    assert sorted(recent["step"].unique()) == list(range(11, 31))
    secs = cause_seconds(recent)
    assert set(secs) == set(CAUSES) and secs["productive"] == 400.0 and secs["low_activity"] == 0
