"""A job that crashes twice and hangs once, played by real processes under ``verl-monitor
run`` (tests/restarting_job.py: verl's checkpoint and resume lines, a save every 3 steps),
started again after each failure as a scheduler's retry would, with one run store:

1. crashes (a CUDA OOM) half-way through step 5 (its last save: step 3);
2. resumes from step 3, redoes step 4, crashes in step 8 (last save: 6);
3. resumes from 6, redoes step 7, hangs in step 10's reward: the exporter's
   ``--on-hang terminate`` ends it once the hang has held 3 s at one place, though its first
   py-spy call of that attempt takes 7 s more (a loaded node: a CI run once never ended the
   hang when one round came late);
4. resumes from 9 and finishes step 12.

Each attempt's ledger and the job's ETTR, from the store and from ``analyze`` of the one log,
agree with a hand computation from the job's own clock (``truth.jsonl``) to the second; the
cadence advice is Young/Daly on the same numbers; the terminate is in the store, in Slack
(a real webhook server) and in the exporter's log, with why."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.analysis.attempts import job_ledger
from monitor.cli import main as cli
from monitor.store import RunStore
from tests.e2e.procs import WebhookRecorder, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
JOB = Path(__file__).resolve().parents[1] / "restarting_job.py"
PLAN = "crash:5,crash:8,hang:10,finish"
TAILS = {1: "crash_loss", 2: "crash_loss", 3: "hang", 4: "shutdown"}


def _slow_pyspy(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``py-spy`` is the real one, 7 s late on its first call in the
    third attempt (the hang's), as on a loaded node."""
    from monitor.hang.pyspy import find_pyspy

    real = find_pyspy()
    assert real, "py-spy is needed (pip install -e '.[all,test]')"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "py-spy"
    wrapper.write_text(f"""#!/bin/sh
if [ "$(wc -l < {tmp_path / 'state' / 'attempts'})" = 3 ] && mkdir {tmp_path / 'slowed'} \\
    2>/dev/null; then sleep 7; fi
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _attempt(tmp_path: Path, hook_file: Path, env: dict[str, str]) -> int:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("hang:\n  min_seconds: 1.0\n")
    exporter = (f"--gpu-backend sim --sim-gpus 1 --store {tmp_path / 'run.db'} --interval 0.5 "
                f"--detect-interval 1 --config {cfg} --slack-webhook-file {hook_file} "
                "--on-hang-after 3 --on-hang-restack 2 --on-hang-grace 2")
    cmd = [CLI, "run", "--log", str(tmp_path / "train.log"), "--listen-address",
           f"127.0.0.1:{free_port()}", "--linger", "2", "--on-hang", "terminate",
           "--exporter-args", exporter, "--", sys.executable, str(JOB), "--state",
           str(tmp_path / "state"), "--plan", PLAN]
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env, timeout=120).returncode
    except subprocess.TimeoutExpired:
        pytest.fail("an attempt ran past 120 s; what the exporter said of the hang:\n"
                    + _said(tmp_path))


def _said(tmp_path: Path) -> str:
    """The exporter's log end and the store's hang_action events (for a failure's message)."""
    log = tmp_path / "train.log.exporter.log"
    text = log.read_text()[-4000:] if log.exists() else "(no exporter log)"
    try:
        acts = [e.message for e in RunStore(tmp_path / "run.db", create=False)
                .events(kind="hang_action")]
    except Exception as exc:  # noqa: BLE001 - the message says why
        acts = [f"(the store cannot be read: {exc})"]
    return text + "\nhang_action events: " + json.dumps(acts, indent=1)


def _hand(tmp_path: Path) -> list[dict]:
    """Each attempt's buckets from the job's own clock and run's start and exit times."""
    truth = [json.loads(x) for x in (tmp_path / "state" / "truth.jsonl").read_text().splitlines()]
    marks = [json.loads(x) for x in (tmp_path / "train.log.attempts").read_text().split("\n")
             if x]
    starts = [m["time"] for m in marks if m["event"] == "start"]
    ends = [m["time"] for m in marks if m["event"] == "end"]
    out, top = [], 0
    for k, (start, end) in enumerate(zip(starts, ends, strict=True), start=1):
        steps = [t for t in truth if t.get("attempt") == k and "step" in t]
        b = dict.fromkeys(("productive", "redone", "overhead", "checkpoint", "between_steps",
                           "hang", "crash_loss", "shutdown"), 0.0)
        b["overhead"] = steps[0]["start"] - start
        for prev, s in zip([None, *steps], steps, strict=False):
            work = s["end"] - s["start"] - s["save"]
            b["redone" if s["step"] <= top else "productive"] += work
            b["checkpoint"] += s["save"]
            b["between_steps"] += 0.0 if prev is None else s["start"] - prev["end"]
        b[TAILS[k]] = end - steps[-1]["end"]
        top = max(top, steps[-1]["step"])
        out.append({"start": start, "end": end, "seconds": b,
                    "steps": [s["step"] for s in steps]})
    return out


def _close(got: dict, want: dict, what: str) -> None:
    for key, value in want.items():
        assert abs(got.get(key, 0.0) - value) <= 1.0, (what, key, got.get(key), value)


def test_a_job_that_crashes_twice_and_hangs_once(tmp_path):
    with WebhookRecorder() as slack:
        hook = tmp_path / "hook"
        hook.write_text(slack.url + "/services/T0/B0/x\n")
        env = _slow_pyspy(tmp_path)
        codes = [_attempt(tmp_path, hook, env) for _ in PLAN.split(",")]
        assert codes == [1, 1, 143, 0]  # the third ended by SIGTERM from the exporter
        slack.wait_for(lambda b: "Hang: job terminated" in json.dumps(b), 30,
                       "the terminate in Slack")
    hand = _hand(tmp_path)
    assert [h["steps"] for h in hand] == [[1, 2, 3, 4], [4, 5, 6, 7], [7, 8, 9], [10, 11, 12]]

    store = RunStore(tmp_path / "run.db", create=False)
    led = job_ledger(store.steps(), sum((store.events(kind=k) for k in (
        "attempt_start", "attempt_end", "hang_action", "checkpoint_load", "resume", "oom",
        "traceback")), []), store.flags())
    # offline: the one log (its .attempts and .arrivals beside it) with the store's events
    # (`verl-monitor export`): the terminate is there, not in the log
    assert cli(["export", str(tmp_path / "run.db"), "--out", str(tmp_path / "rec")]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["analyze", str(tmp_path / "train.log"), "--events",
                    str(tmp_path / "rec" / "events.json"), "--json"]) == 0
    doc = json.loads(out.getvalue())
    for source, ledger in (("store", led), ("analyze", doc["attempts"])):
        atts = ledger["attempts"]
        assert [a["ended_by"] for a in atts] == ["crash", "crash", "terminated", "finished"], \
            (source, [a["detail"] for a in atts])
        assert [a["resumed_from"] for a in atts] == [None, 3, 6, 9]
        assert [a["redone_steps"] for a in atts] == [0, 1, 1, 0]
        for a, h in zip(atts, hand, strict=True):
            assert abs(a["start"] - h["start"]) < 0.01 and abs(a["end"] - h["end"]) < 0.01
            _close(a["seconds"], h["seconds"], f"{source} attempt {a['attempt']}")
        wall = hand[-1]["end"] - hand[0]["start"]
        productive = sum(h["seconds"]["productive"] for h in hand)
        assert abs(ledger["wall"] - wall) <= 1.0 and abs(ledger["productive"] - productive) <= 1
        assert ledger["ettr"] == pytest.approx(productive / wall, abs=0.02)
    assert "SIGTERM" in led["attempts"][2]["detail"]

    # the terminate, and why, in the store and the exporter's log
    acted = [e for e in store.events(kind="hang_action") if e.data["acted"]]
    assert len(acted) == 1 and "compute_score" in acted[0].message
    assert "the hang held" in acted[0].message and "stack rounds found the same place" in \
        acted[0].message
    assert "on-hang terminate: Terminated the hung job" in \
        (tmp_path / "train.log.exporter.log").read_text()
    assert store.events(kind="hang_evidence"), "terminate saves the evidence first"
    assert (tmp_path / "slowed").is_dir(), "the hang attempt's first py-spy call was slowed"

    # the cadence: Young/Daly on the job's own numbers (3 failures over the attempts)
    cad = doc["cadence"]
    saves = [t["save"] for t in map(json.loads, (tmp_path / "state" / "truth.jsonl")
                                    .read_text().splitlines()) if t.get("save")]
    up = sum(h["end"] - h["start"] for h in hand)
    assert cad["save_freq"] == 3 and cad["failures"] == 3
    assert cad["save_cost_s"] == pytest.approx(sorted(saves)[len(saves) // 2], abs=0.01)
    assert cad["mtbf_s"] == pytest.approx(up / 3, abs=1.0)
    tau = math.sqrt(2 * cad["save_cost_s"] * cad["mtbf_s"])
    assert cad["interval_s"] == pytest.approx(tau, abs=0.01)
    assert cad["interval_steps"] == max(1, round(tau / cad["step_s"]))
    assert "trainer.save_freq" in cad["advice"]
    assert [c["attempt"] for c in cad["failure_costs"]] == [1, 2, 3]
