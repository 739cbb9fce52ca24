"""The canonical vocabulary: records serialise to plain JSON, scope labels stay short and
ordered, and the name lists are consistent with each other."""

from __future__ import annotations

import json

from monitor.records import (
    ALL_PHASES,
    DERIVED_PHASES,
    FLAG_KINDS,
    PHASES,
    SEVERITIES,
    TRAINING_PHASES,
    Event,
    Flag,
    StepRecord,
)


def test_records_serialise_to_plain_json():
    rec = StepRecord(7, end_time=100.0, total=12.5, phases={"gen": 8.0},
                     metrics={"timing_s/gen": 8.0})
    flag = Flag("reshard_spike", "warning", 90.0, None, scope={"node": "n0", "steps": [5, 7]},
                evidence="reshard 40 s", advice=["Set actor_rollout_ref.rollout.x"])
    event = Event("oom", 95.0, 7, "CUDA out of memory", {"rank": 3})
    for obj in (rec, flag, event):
        d = obj.to_dict()
        assert json.loads(json.dumps(d)) == d
    assert rec.to_dict()["phases"] == {"gen": 8.0}
    assert flag.to_dict()["end"] is None


def test_scope_label_is_ordered_and_leaves_out_steps_and_empty_parts():
    flag = Flag("gpu_imbalance", "warning", 0.0, None,
                scope={"phase": "gen", "gpus": [3, 5], "node": "n0", "steps": [1, 99]})
    assert flag.scope_label == "node=n0 gpus=3,5 phase=gen"
    assert Flag("stalled", "critical", 0.0, None, scope={"gpus": []}).scope_label == ""


def test_name_lists_have_no_duplicates_and_nest_properly():
    for names in (PHASES, DERIVED_PHASES, FLAG_KINDS, SEVERITIES):
        assert len(set(names)) == len(names)
    assert ALL_PHASES == PHASES + DERIVED_PHASES
    assert set(TRAINING_PHASES) <= set(PHASES)
    assert SEVERITIES == ("info", "warning", "critical")  # ordered by rank: trackers rely on it
