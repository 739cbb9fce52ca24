"""A real verl run killed and resumed, booked across its attempts (issue 40).

verl 4c3310db (GRPO, HF rollout, one H200) under ``verl-monitor run`` twice with one log
(``bench/real_verl/cases.py``: ``kill_resume``; ``bench/results/real_verl_resume_*_H200.txt``):
``trainer.save_freq=2``, the job's process group SIGKILLed once step 5's line was out, then
``trainer.resume_mode=auto``, which loaded ``global_step_4`` and ran steps 5-8. verl's own lines
say it: "Load from checkpoint folder ... global_step_4", "Setting global step to 4".
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from cli.main import main

LOG = Path(__file__).resolve().parent / "fixtures" / "real_verl_resume" / "train.log"


@pytest.fixture(scope="module")
def ledger() -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["analyze", str(LOG), "--json"])
    assert code in (0, None)
    return json.loads(out.getvalue())["attempts"]


def test_the_kill_and_the_resume_are_two_attempts_with_step_5_redone(ledger) -> None:
    first, second = ledger["attempts"]
    assert (first["first_step"], first["last_step"], first["redone_steps"]) == (1, 5, 0)
    assert "kill" in first["ended_by"]
    assert (second["first_step"], second["last_step"]) == (5, 8)
    assert second["resumed_from"] == 4 and second["redone_steps"] == 1
    assert (first["saves"], second["saves"]) == (2, 2)


def test_the_job_books_what_the_kill_cost(ledger) -> None:
    secs = ledger["seconds"]
    # step 5 took 3.2 s before the kill and 3.4 s when redone (verl's timing_s/step)
    assert secs["redone"] == pytest.approx(3.4, abs=0.1)
    assert 0 < secs["productive"] < ledger_wall(ledger)
    [cost] = ledger["failure_costs"]
    assert cost["step"] == 5 and cost["seconds"] > secs["redone"]


def ledger_wall(ledger: dict) -> float:
    return sum(v for v in ledger["seconds"].values() if v)
