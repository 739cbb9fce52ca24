"""A job killed right after a step and resumed from the checkpoint before it, read back from
its exported run store (``analyze train.jsonl --events events.json``): the step done twice is
two records, and the run's own attempt marks split the job (not the file as one attempt too)."""

from __future__ import annotations

import contextlib
import io
import json

from monitor.analysis.attempt_logs import prefer_run_marks
from monitor.cli import main as cli
from monitor.logs.files import parse_file
from monitor.records import Event

T0 = 1796292000.0


def _row(step: int, end: float, save: bool = False, **extra) -> str:
    data = {"timing_s/step": 10.0, "timing_s/gen": 5.0, "timing_s/update_actor": 5.0, **extra}
    if save:
        data["timing_s/save_checkpoint"] = 1.0
    return json.dumps({"step": step, "ts": T0 + end, "data": data})


#: Attempt 1 (0-75 s): steps 1-5 ending at 30, 40, ..., 70 (saves at 2 and 4), killed at 71.
#: Attempt 2 (80-150 s): resumes from step 4 at 95, steps 5-8 ending at 110, ..., 140.
ROWS = [_row(1, 30), _row(2, 40, True), _row(3, 50), _row(4, 60, True), _row(5, 70),
        _row(5, 110), _row(6, 120, True), _row(7, 130), _row(8, 140, True)]


def _mark(kind: str, t: float, **data) -> dict:
    return {"kind": kind, "time": T0 + t, "step": None, "message": kind,
            "data": {"source": "run", **data}}


EVENTS = [_mark("attempt_start", 0, offset=0), _mark("attempt_end", 71, status=137),
          _mark("attempt_start", 80, offset=999),
          {"kind": "resume", "time": T0 + 95, "step": 4, "message": "Setting global step to 4",
           "data": {"reason": "setting_global_step"}},
          _mark("attempt_end", 150, status=0)]


def test_a_step_run_again_is_a_second_record_a_part_or_a_repeat_is_not(tmp_path):
    log = tmp_path / "train.jsonl"
    late_part = json.dumps({"step": 8, "ts": T0 + 141, "data": {"val/score": 0.5}})
    log.write_text("\n".join([*ROWS, ROWS[-1], late_part]) + "\n")  # step 8 twice, then a part
    steps = parse_file(log).steps
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    assert [s.end_time - T0 for s in steps if s.step == 5] == [70, 110]
    assert "val/score" in steps[-1].metrics


def test_the_exported_store_books_the_kill_and_the_redone_step(tmp_path):
    (tmp_path / "train.jsonl").write_text("\n".join(ROWS) + "\n")
    (tmp_path / "events.json").write_text(json.dumps(EVENTS))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["analyze", str(tmp_path / "train.jsonl"), "--events",
                    str(tmp_path / "events.json"), "--json"]) == 0
    led = json.loads(out.getvalue())["attempts"]
    a1, a2 = led["attempts"]
    assert (a1["ended_by"], a1["first_step"], a1["last_step"], a1["saves"]) == \
        ("killed", 1, 5, 2)
    assert (a2["resumed_from"], a2["first_step"], a2["redone_steps"], a2["saves"]) == (4, 5, 1, 2)
    assert (led["failures"], led["steps_redone"], led["saves"]) == (1, 1, 4)
    assert led["seconds"]["redone"] == 10.0 and led["wall"] == 150.0


def test_a_log_outside_the_run_marks_keeps_its_own_attempt():
    def fmark(kind, t, path):
        return Event(kind, T0 + t, None, kind, {"source": "file", "path": path})

    run = [Event("attempt_start", T0 + 100, None, "", {"source": "run"}),
           Event("attempt_end", T0 + 200, None, "", {"source": "run", "status": 0})]
    inside = [fmark("attempt_start", 110, "b.jsonl"), fmark("attempt_end", 190, "b.jsonl")]
    before = [fmark("attempt_start", 0, "a.log"), fmark("attempt_end", 50, "a.log")]
    kept = prefer_run_marks(before + run + inside)
    assert kept == before + run
