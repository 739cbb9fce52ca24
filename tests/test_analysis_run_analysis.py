"""RunAnalysis, the one face over a run's frames and Config, and the ledger causes that match
what happened (issue 28 item 4, issue 31 items 4 and 6)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitor.analysis.goodput import CAUSES, imbalance, ledger, totals
from monitor.analysis.run_analysis import RunAnalysis, rank_problems
from monitor.frames import read_gpu_frame
from monitor.logs.canonical_records import parse_file
from monitor.records import Flag, StepRecord

REAL = Path(__file__).parent / "fixtures" / "real_gpu"


def _gpu(t1: float, act, n_gpu: int = 1, period: float = 0.25) -> pd.DataFrame:
    """Samples every ``period`` s up to ``t1``; ``act(t, gpu)`` gives (util, sm)."""
    rows = []
    for t in np.arange(0.0, t1, period):
        for g in range(n_gpu):
            util, sm = act(float(t), g)
            rows.append({"ts": float(t), "node": "n0", "gpu": g, "util": util, "sm_active": sm})
    return pd.DataFrame(rows)


def _hf_steps(gens: list[float], upd: float = 1.0, ratio: float | None = 1.03):
    """Steps as real verl's HF rollout logs them: gen then update_actor, back to back."""
    steps, t = [], 0.0
    for n, gen in enumerate(gens, start=1):
        t += gen + upd
        metrics = {} if ratio is None else {"response_length/max": 128.0 * ratio,
                                            "response_length/mean": 128.0}
        steps.append(StepRecord(step=n, end_time=t, total=gen + upd, time_source="line",
                                phases={"gen": gen, "update_actor": upd}, metrics=metrics))
    return steps


def _thin_decode(steps: list[StepRecord]):
    """A prefill at SM 60% for the first 0.5 s of each gen, then a thin decode at SM 6%; the
    update at SM 70%."""
    spans = [(s.end_time - s.total, s.end_time - s.total + s.phases["gen"]) for s in steps]

    def act(t, _g):
        for a, b in spans:
            if a <= t < b:
                return (90.0, 60.0) if t < a + 0.5 else (60.0, 6.0)
        return 95.0, 70.0

    return act


def test_the_first_steps_warm_up_is_its_own_cause_not_the_long_tail():
    # real verl on one H200: step 1's generation 18.5 s against 2.6-4 s later, responses
    # uniform (longest/mean 1.03); it was booked as rollout_long_tail, 19.5% of the GPU time
    steps = _hf_steps([18.5, 3.0, 2.6, 4.0, 3.2])
    led = RunAnalysis(steps, _gpu(steps[-1].end_time, _thin_decode(steps)), flags=[]).ledger()
    assert imbalance(led) < 1e-6
    first = led[led["step"] == 1].iloc[0]
    # what step 1 lost is the warm-up's (the rest of it reads productive against the run's
    # own reference activity, docs/goodput.md)
    assert first["warmup"] > 0.5 * 18.5, first
    assert first["low_activity"] == first["rollout_long_tail"] == 0.0
    assert led["rollout_long_tail"].sum() == 0.0
    later = led[led["step"] > 1]
    assert later["warmup"].sum() == 0.0
    # against a known-good generation (SM 60%), the later steps' thin decode of uniform
    # responses is slow decoding: low activity, still no tail
    from monitor.config import load_config

    cfg = load_config()
    cfg["goodput"]["reference_sm"]["gen"] = 60.0
    strict = RunAnalysis(steps, _gpu(steps[-1].end_time, _thin_decode(steps)), flags=[],
                         config=cfg).ledger()
    later = strict[strict["step"] > 1]
    assert later["low_activity"].sum() > 0.5 * sum(s.phases["gen"] for s in steps[1:])
    assert strict["rollout_long_tail"].sum() == 0.0


def test_a_thin_decode_is_a_tail_only_where_the_responses_have_one():
    steps = _hf_steps([3.0] * 6, ratio=1.03)
    gpu = _gpu(steps[-1].end_time, _thin_decode(steps))
    uniform = totals(ledger(steps, gpu, [], config={}))
    assert uniform["lost"]["rollout_long_tail"] == 0.0
    long = _hf_steps([3.0] * 6, ratio=5.3)  # the longest response 5.3x the mean
    tail = totals(ledger(long, gpu, [], config={}))
    assert tail["lost"]["rollout_long_tail"] > 0.5 * 5 * 2.5  # steps 2-6, after the prefill
    unknown = totals(ledger(_hf_steps([3.0] * 6, ratio=None), gpu, [], config={}))
    assert unknown["lost"]["rollout_long_tail"] == pytest.approx(
        tail["lost"]["rollout_long_tail"])  # no lengths in the log: the GPU samples judge


def test_steps_a_rollout_long_tail_flag_covers_book_gens_loss_as_the_tail():
    # the mean across GPUs (the dashboard from Prometheus) hides who waited: gen reads half
    # busy; the ledger booked low_activity where the Flags page had a critical long tail
    steps = _hf_steps([6.0] * 6, ratio=None)

    def act(t, _g):
        return (55.0, 30.0) if any(s.end_time - s.total <= t < s.end_time - s.total + 6.0
                                   for s in steps[2:4]) else (95.0, 70.0)

    gpu = _gpu(steps[-1].end_time, act)
    flag = Flag("rollout_long_tail", "critical", steps[2].end_time - 7.0, steps[3].end_time,
                scope={"phase": "gen", "steps": [3, 4]}, evidence="tail")
    plain = RunAnalysis(steps, gpu, flags=[]).ledger().set_index("step")
    flagged = RunAnalysis(steps, gpu, flags=[flag]).ledger().set_index("step")
    for s in (3, 4):
        assert plain.loc[s, "low_activity"] > 2.0 and plain.loc[s, "rollout_long_tail"] == 0.0
        assert flagged.loc[s, "rollout_long_tail"] == pytest.approx(
            plain.loc[s, "low_activity"], rel=0.01)
        assert flagged.loc[s, "low_activity"] < 0.01
    assert flagged.loc[5, "rollout_long_tail"] == 0.0


def test_the_trainer_books_its_wait_for_the_weight_sync_printed_on_a_line_of_its_own():
    # the fully-async trainer prints timing_s/param_sync on a line of its own after the step
    steps, t = [], 0.0
    for n in range(1, 6):
        t += 10.0
        steps.append(StepRecord(step=n, end_time=t, total=10.0, time_source="line",
                                phases={"gen": 6.0, "update_actor": 4.0},
                                metrics={"fully_async/trainer/idle_ratio": 0.6}))
        t += 5.0
        steps.append(StepRecord(step=n, end_time=t, total=None, time_source="line",
                                phases={"reshard": 5.0}, metrics={"timing_s/param_sync": 5.0}))
    gpu = _gpu(80.0, lambda t, g: (100.0, 90.0))
    tot = totals(ledger(steps, gpu, [], config={}))
    # the syncs after steps 1-4 lie inside the next step's wall interval: the trainer's wait
    assert tot["lost"]["parameter_sync"] == pytest.approx(4 * 5.0)
    assert tot["unattributed"] < 0.5


def test_the_printed_v1_config_makes_gen_the_wait_for_the_rollout_pool():
    """Keys every trainer prints (gen, update_actor) and a printed config of verl 0.9's V1
    separate-async trainer: the run has a trainer and a rollout pool, and the trainer's gen is
    booked as its wait for samples, in the log's pools and in the GPU ledger alike."""
    steps = [dataclasses.replace(s, metrics={**s.metrics, "timing_s/gen": 10.0,
                                             "timing_s/update_actor": 1.0,
                                             "timing_s/step": 11.0})
             for s in _hf_steps([10.0] * 4)]
    gpu = _gpu(steps[-1].end_time, lambda t, g: (90.0, 0.6))
    plain = RunAnalysis(steps, gpu)
    assert plain.mode == ("sync", "keys")
    assert plain.ledger()["waiting_for_samples"].sum() == 0
    v1 = {"trainer": {"use_v1": True, "v1": {"trainer_mode": "separate_async"}}}
    ra = RunAnalysis(steps, gpu, job_config=v1)
    assert ra.mode == ("separate_async", "config")
    assert ra.ledger()["waiting_for_samples"].sum() == pytest.approx(40.0, abs=0.5)
    pools = RunAnalysis(steps, job_config=v1).pools()
    assert pools["mode"] == "separate_async"
    assert [p["pool"] for p in pools["pools"]] == ["trainer", "rollout"]


def test_two_exporters_reporting_the_same_steps_are_not_a_restart():
    steps = _hf_steps([3.0] * 5, ratio=None)
    twice = sorted(steps + [StepRecord(step=s.step, end_time=s.end_time + 0.4, total=s.total,
                                       time_source="line", phases=dict(s.phases))
                            for s in steps], key=lambda s: s.end_time)
    gpu = _gpu(steps[-1].end_time + 1.0, lambda t, g: (95.0, 70.0))
    led = ledger(twice, gpu, [], config={})
    assert led["restarts"].sum() == 0.0
    assert totals(led)["gpu_seconds_total"] == pytest.approx(
        totals(ledger(steps, gpu, [], config={}))["gpu_seconds_total"], abs=0.5)
    # two simulated jobs in one Prometheus job, the second 2.5 s behind: its step numbers
    # repeat a step time apart at most (the dashboard named restarts 47% of the GPU time)
    mixed = sorted(steps + [StepRecord(step=s.step, end_time=s.end_time + 2.5, total=s.total,
                                       time_source="line", phases=dict(s.phases))
                            for s in steps], key=lambda s: s.end_time)
    assert ledger(mixed, gpu, [], config={})["restarts"].sum() == 0.0


def _flag(kind, severity, steps, gpus=None, start=0.0):
    scope = {"steps": steps, **({"gpus": gpus, "node": "n0"} if gpus else {})}
    return Flag(kind, severity, start, None, scope=scope, evidence=kind, advice=[f"fix {kind}"])


def test_the_costliest_flag_is_the_top_problem_within_its_severity():
    d = REAL / "2gpu_long_tail"
    parsed = parse_file(str(d / "train.jsonl"))
    ra = RunAnalysis(parsed.steps, read_gpu_frame(d / "gpu.csv"), events=parsed.events)
    kinds = {f.kind for f in ra.flags()}
    assert {"rollout_long_tail", "gpu_imbalance"} <= kinds
    top = ra.top_problem()
    assert top["kind"] == "rollout_long_tail" and top["gpu_seconds"] > 50
    costs = {c["kind"]: c["gpu_seconds"] for c in ra.flag_costs()}
    assert costs["rollout_long_tail"] > costs["gpu_imbalance"]
    # a critical flag still comes first; a straggler counts the low activity it explains
    led = ra.ledger()
    crit = _flag("oom", "critical", [7, 7], start=1.0)
    low = _flag("low_utilization", "warning", [2, 8], gpus=[0], start=2.0)
    strag = _flag("gpu_imbalance", "warning", [5, 7], gpus=[1], start=0.5)
    ranked = [e["kind"] for e in rank_problems([low, strag, crit], led,
                                               {"low_utilization": ["gpu_imbalance"]})]
    assert ranked == ["oom", "gpu_imbalance", "low_utilization"]
    alone = [e["kind"] for e in rank_problems([low, strag], led, {})]
    assert alone[0] == "low_utilization"  # unexplained, its low activity costs more


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_analyze_names_the_costliest_flag_as_the_top_problem(capsys):
    from cli.main import main

    d = REAL / "2gpu_long_tail"
    args = ["analyze", str(d / "train.jsonl"), "--gpu", str(d / "gpu.csv")]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["top_problem"]["kind"] == "rollout_long_tail"
    assert doc["flag_costs"][0]["kind"] == "rollout_long_tail"
    assert doc["goodput"]["lost"]["warmup"] > 0 and set(doc["goodput"]["lost"]) <= set(CAUSES)
    assert main(args) == 0
    text = capsys.readouterr().out
    flags = text[text.index("Flags ("):]
    assert flags.splitlines()[1].startswith("  Top problem: rollout_long_tail")


def test_every_cause_says_what_it_is_and_what_to_do_in_one_line():
    from monitor.analysis.goodput import CAUSE_TEXT, cause_line

    assert set(CAUSE_TEXT) == set(CAUSES)
    for cause in CAUSES:
        line = cause_line(cause)
        assert line.startswith(f"{cause}: ") and "\n" not in line
        assert cause == "productive" or "; " in line, line  # what it is; what to do
