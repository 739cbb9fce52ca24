"""The attempt ledger against a hand computation: a job that crashed, hung and finished."""

from __future__ import annotations

import pytest

from monitor.analysis.attempts import BUCKETS, attempts, job_ledger, split_attempts
from monitor.records import Event, Flag, StepRecord


def _step(n: int, end: float, save: float = 0.0, source: str = "sidecar") -> StepRecord:
    """A 10 s step (gen 5, update 5 - save), its save inside the step timer (verl 0.5)."""
    phases = {"gen": 5.0, "update_actor": 5.0 - save}
    if save:
        phases["save_checkpoint"] = save
    # its values differ from run to run (a redone step logs other losses): the store keeps both
    return StepRecord(step=n, end_time=end, total=10.0, phases=phases, time_source=source,
                      metrics={"actor/pg_loss": end / 1e4})


def _mark(kind: str, t: float, status: int | None = None) -> Event:
    data = {"source": "run"} if kind == "attempt_start" else {"source": "run", "status": status}
    return Event(kind, t, None, "", data)


def _job() -> tuple[list[StepRecord], list[Event], list[Flag]]:
    """Attempt 1 (1000-1116): overhead 30, steps 1-7 12 s apart (2 s between), a save at 5,
    an OOM at 1115, exit 1. Down 14 s. Attempt 2 (1130-1295): resumes from step 5 (load at
    1150), steps 6-12 from 1160, a save at 10, a hang flag at 1260 after step 12 (1242),
    terminated at 1290, status 143. Down 5 s. Attempt 3 (1300-1395): resumes from 10, steps
    11-15 from 1330, a save at 15, exit 0 at 1395."""
    steps, events = [], []
    events += [_mark("attempt_start", 1000.0)]
    steps += [_step(k, 1040.0 + 12 * (k - 1), 3.0 if k == 5 else 0.0) for k in range(1, 8)]
    events += [Event("oom", 1115.0, 7, "torch.OutOfMemoryError: CUDA out of memory. Tried "
                     "to allocate 2.00 GiB", {}), _mark("attempt_end", 1116.0, 1)]
    events += [_mark("attempt_start", 1130.0),
               Event("checkpoint_load", 1150.0, None, "Load from checkpoint folder: "
                     "/ckpt/global_step_5", {"path": "/ckpt/global_step_5"}),
               Event("resume", 1150.5, 5, "Setting global step to 5",
                     {"reason": "setting_global_step"})]
    steps += [_step(k, 1170.0 + 12 * (k - 6), 3.0 if k == 10 else 0.0) for k in range(6, 13)]
    flags = [Flag("hang", "critical", 1260.0, None, {"node": "n0"},
                  "No progress for 18 s after step 12. Where (py-spy): the driver (PID 7) is "
                  "scoring rewards [phase reward], at compute_score (rewards.py:9).", [])]
    events += [Event("hang_action", 1290.0, None, "terminated the job's process tree (PID 7)"
                     ": the hang held 30 s", {"action": "terminate", "acted": True}),
               _mark("attempt_end", 1295.0, 143)]
    events += [_mark("attempt_start", 1300.0),
               Event("checkpoint_load", 1320.0, None, "Load from checkpoint folder: "
                     "/ckpt/global_step_10", {"path": "/ckpt/global_step_10"})]
    steps += [_step(k, 1340.0 + 12 * (k - 11), 3.0 if k == 15 else 0.0) for k in range(11, 16)]
    events += [_mark("attempt_end", 1395.0, 0)]
    return steps, events, flags


HAND = [  # attempt: (wall, seconds by bucket), computed by hand in _job's docstring
    (116.0, {"overhead": 30.0, "productive": 67.0, "checkpoint": 3.0, "between_steps": 12.0,
             "crash_loss": 4.0}),
    (165.0, {"overhead": 30.0, "redone": 20.0, "productive": 47.0, "checkpoint": 3.0,
             "between_steps": 12.0, "hang": 53.0}),
    (95.0, {"overhead": 30.0, "redone": 20.0, "productive": 27.0, "checkpoint": 3.0,
            "between_steps": 8.0, "shutdown": 7.0}),
]


def test_each_attempt_books_its_wall_time_as_computed_by_hand():
    atts = attempts(*_job())
    assert [a.index for a in atts] == [1, 2, 3]
    for att, (wall, want) in zip(atts, HAND, strict=True):
        assert att.wall == pytest.approx(wall)
        assert att.seconds == pytest.approx({b: want.get(b, 0.0) for b in BUCKETS})
        assert sum(att.seconds.values()) == pytest.approx(att.wall)
    assert [a.ended_by for a in atts] == ["crash", "terminated", "finished"]
    assert [a.resumed_from for a in atts] == [None, 5, 10]
    assert [a.redone_steps for a in atts] == [0, 2, 2]
    assert "CUDA out of memory" in atts[0].detail and "exit status 1" in atts[0].detail
    assert "signal 15 (SIGTERM)" in atts[1].detail


def test_the_jobs_ettr_is_productive_over_its_wall_time_between_attempts_included():
    doc = job_ledger(*_job())
    assert doc["wall"] == pytest.approx(395.0)  # 1000 to 1395
    assert doc["seconds"]["between_attempts"] == pytest.approx(14.0 + 5.0)
    assert doc["productive"] == pytest.approx(67.0 + 47.0 + 27.0)
    assert doc["ettr"] == pytest.approx(round(141.0 / 395.0, 4))
    assert sum(doc["seconds"].values()) == pytest.approx(doc["wall"])
    assert (doc["failures"], doc["steps_redone"], doc["saves"]) == (2, 4, 3)


def test_each_failure_costs_the_time_until_a_later_attempt_finished_its_last_step_again():
    costs = job_ledger(*_job())["failure_costs"]
    # attempt 1's step 7 ended at 1112, again at 1182; attempt 2's step 12 at 1242, again 1352
    assert costs == [{"attempt": 1, "ended_by": "crash", "step": 7, "seconds": 70.0,
                      "back": True},
                     {"attempt": 2, "ended_by": "terminated", "step": 12, "seconds": 110.0,
                      "back": True}]


def test_one_log_without_recorded_starts_is_cut_at_its_resume_line():
    steps, events, flags = _job()
    plain = [e for e in events if not e.kind.startswith("attempt_")]
    atts = attempts(steps, plain, flags)
    assert [(a.start_source, a.first_step, a.last_step) for a in atts] == [
        ("first_line", 1, 7), ("resume_line", 6, 12), ("resume_line", 11, 15)]
    # the second attempt starts at its resume line (1150); the first ends at its last line
    assert (atts[0].end, atts[1].start) == (1115.0, 1150.0)
    assert atts[1].resumed_from == 5 and atts[1].ended_by == "terminated"
    assert atts[2].ended_by == "unknown" and atts[2].seconds["after_last_step"] == 0.0


def test_a_step_number_going_back_without_a_resume_line_starts_an_attempt_at_that_step():
    steps = [_step(k, 100.0 + 10 * k) for k in range(1, 4)] + \
        [_step(k, 200.0 + 10 * k) for k in range(1, 3)]
    events = [Event("resume", 210.0, 1, "step went back from 3 to 1",
                    {"reason": "step_backwards", "from_step": 3})]
    atts = attempts(steps, events)
    assert [(a.first_step, a.last_step, a.redone_steps) for a in atts] == [(1, 3, 0), (1, 2, 2)]
    assert atts[1].start == pytest.approx(200.0, abs=1e-3)


def test_a_running_attempt_is_booked_up_to_its_last_step():
    steps, events, flags = _job()
    live = [e for e in events if not (e.kind == "attempt_end" and e.time == 1395.0)]
    doc = job_ledger(steps, live, flags, running=True)
    last = doc["attempts"][-1]
    assert last["ended_by"] == "running" and last["end"] is None
    assert last["wall"] == pytest.approx(1388.0 - 1300.0)
    assert doc["wall"] == pytest.approx(388.0)


def test_a_hang_that_cleared_is_taken_out_of_the_step_that_ended_it():
    steps = [_step(1, 110.0), _step(2, 122.0), StepRecord(3, 222.0, 100.0, {"gen": 5.0,
             "reward": 95.0}, time_source="sidecar"), _step(4, 234.0)]
    events = [_mark("attempt_start", 100.0), _mark("attempt_end", 240.0, 0)]
    flag = Flag("hang", "critical", 180.0, 222.5, {}, "No progress for 58 s after step 2", [])
    att = attempts(steps, events, [flag])[0]
    assert att.seconds["hang"] == pytest.approx(100.0)  # step 2's end (122) to step 3's (222)
    assert att.seconds["productive"] == pytest.approx(10 + 10 + 0 + 10)
    assert att.ended_by == "finished"


def test_a_log_without_measured_times_has_no_ettr_and_says_why():
    steps = [_step(k, 100.0 + 10 * k, source="rebuilt") for k in range(1, 4)]
    doc = job_ledger(steps, [])
    assert doc["ettr"] is None and "not measured" in doc["premises"][0]
    assert len(doc["attempts"]) == 1


def test_an_attempt_that_hung_before_its_first_step_holds_the_hang_from_its_last_line():
    events = [_mark("attempt_start", 100.0),
              Event("checkpoint_load", 130.0, None, "Load from checkpoint folder: /c/global_"
                    "step_4", {"path": "/c/global_step_4"}), _mark("attempt_end", 300.0, 137)]
    flag = Flag("hang", "critical", 200.0, None, {}, "No progress", [])
    att = attempts([], events, [flag])[0]
    assert att.ended_by == "hang" and "signal 9 (SIGKILL)" in att.detail
    assert att.seconds["overhead"] == pytest.approx(30.0)
    assert att.seconds["hang"] == pytest.approx(170.0)


def test_no_steps_and_no_events_is_no_attempt():
    assert split_attempts([], []) == []
    doc = job_ledger([], [])
    assert doc["attempts"] == [] and doc["ettr"] is None
