"""``verl-monitor analyze attempt1.log attempt2.log`` and one log holding both: the ledger
across the attempts, against a hand computation."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

from monitor.cli import main as cli

T0 = 1796292000.0  # 2026-12-03 10:00:00 UTC


def _ts(t: float) -> str:
    return time.strftime("[%Y-%m-%d %H:%M:%S]", time.gmtime(T0 + t))


def _step(t: float, n: int, save: bool = False) -> str:
    parts = (f"step:{n} - timing_s/step:10.0 - timing_s/gen:5.0 - timing_s/update_actor:"
             f"{2.0 if save else 5.0}" + (" - timing_s/save_checkpoint:3.0" if save else "")
             + f" - actor/pg_loss:{t / 1000:.3f}")
    return f"{_ts(t)} (TaskRunner pid=11) {parts}"


#: Attempt 1 (0-67 s): its first line at 0, steps 1-3 12 s apart from 30 s (a save at 2),
#: an OOM at 67. Attempt 2 (80-145 s): first line at 80, resumes from step 2 at 90, steps
#: 3-5 from 110 (a save at 4), tqdm at its total at 145.
ATTEMPT1 = [f"{_ts(0)} (TaskRunner pid=11) TaskRunner hostname: n0, PID: 11",
            f"{_ts(10)} (TaskRunner pid=11) Training from scratch",
            _step(40, 1), _step(52, 2, True), _step(64, 3),
            f"{_ts(67)} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
ATTEMPT2 = [f"{_ts(80)} (TaskRunner pid=12) TaskRunner hostname: n0, PID: 12",
            f"{_ts(90)} (TaskRunner pid=12) Load from checkpoint folder: /ckpt/global_step_2",
            f"{_ts(90)} (TaskRunner pid=12) Setting global step to 2",
            _step(120, 3), _step(132, 4, True), _step(144, 5),
            f"{_ts(145)} (TaskRunner pid=12) Training Progress: 100%|##########| 5/5 "
            "[01:05<00:00, 12.00s/it]"]


def _analyze(*paths) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["analyze", *map(str, paths), "--json"]) == 0
    return json.loads(out.getvalue())


def _write(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_two_logs_of_one_job_are_two_attempts_booked_as_by_hand(tmp_path):
    doc = _analyze(_write(tmp_path / "a1.log", ATTEMPT1), _write(tmp_path / "a2.log", ATTEMPT2))
    led = doc["attempts"]
    a1, a2 = led["attempts"]
    assert (a1["start"], a1["end"], a2["start"], a2["end"]) == (T0, T0 + 67, T0 + 80, T0 + 145)
    # 1: start-up 30, steps 3 x 10 - save 3 = 27, between steps 2 x 2, crash 64 -> 67
    assert {k: v for k, v in a1["seconds"].items() if v} == {
        "overhead": 30.0, "productive": 27.0, "checkpoint": 3.0, "between_steps": 4.0,
        "crash_loss": 3.0}
    # 2: start-up 30 (80 -> 110), step 3 redone 10, steps 4-5 17 + save 3, between 4, 1 after
    assert {k: v for k, v in a2["seconds"].items() if v} == {
        "overhead": 30.0, "redone": 10.0, "productive": 17.0, "checkpoint": 3.0,
        "between_steps": 4.0, "shutdown": 1.0}
    assert (a1["ended_by"], a2["ended_by"], a2["resumed_from"]) == ("crash", "finished", 2)
    assert "CUDA out of memory" in a1["detail"]
    assert led["seconds"]["between_attempts"] == 13.0 and led["wall"] == 145.0
    assert led["ettr"] == round(44.0 / 145.0, 4)
    assert led["failure_costs"] == [{"attempt": 1, "ended_by": "crash", "step": 3,
                                     "seconds": 120.0 - 64.0, "back": True}]
    assert doc["logs"] == [str(tmp_path / "a1.log"), str(tmp_path / "a2.log")]
    assert doc["cadence"]["save_cost_s"] == 3.0 and doc["cadence"]["failures"] == 1


def test_one_log_holding_both_is_cut_at_the_resume_line(tmp_path):
    doc = _analyze(_write(tmp_path / "both.log", ATTEMPT1 + ATTEMPT2))
    a1, a2 = doc["attempts"]["attempts"]
    assert (a1["start"], a1["end"]) == (T0, T0 + 67)
    # the log marks no start: the second attempt begins at its resume line (90, not 80)
    assert (a2["start"], a2["start_source"], a2["seconds"]["overhead"]) == (
        T0 + 90, "resume_line", 20.0)
    assert doc["attempts"]["seconds"]["between_attempts"] == 23.0


def test_the_text_report_shows_each_attempt_the_ettr_and_the_cadence(tmp_path, capsys):
    paths = [_write(tmp_path / "a1.log", ATTEMPT1), _write(tmp_path / "a2.log", ATTEMPT2)]
    assert cli(["analyze", *paths]) == 0
    text = capsys.readouterr().out
    part = text.split("Attempts of the job\n")[1].split("\n\n")[0]
    assert "#1 2026-12-03 10:00:00 UTC, 67 s: steps 1-3; crash: oom: torch.OutOfMemoryError" \
        in part
    assert "ETTR 30.3%" in part and "failure #1 (crash) cost 56 s" in part
    assert "checkpoints: Save every" in part and "trainer.save_freq=" in part


def test_a_single_clean_log_has_no_attempts_section(tmp_path, capsys):
    assert cli(["analyze", _write(tmp_path / "a2.log", ATTEMPT2[3:])]) == 0
    assert "Attempts of the job" not in capsys.readouterr().out


def test_a_later_log_that_is_missing_is_one_line_and_status_2(tmp_path, capsys):
    assert cli(["analyze", _write(tmp_path / "a1.log", ATTEMPT1), str(tmp_path / "no.log")]) == 2
    assert "no.log: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("hours", ["0", "-1", "x"])
def test_a_bad_mtbf_is_refused(tmp_path, hours, capsys):
    with pytest.raises(SystemExit):
        cli(["analyze", _write(tmp_path / "a1.log", ATTEMPT1), "--mtbf-hours", hours])
    assert "--mtbf-hours" in capsys.readouterr().err
