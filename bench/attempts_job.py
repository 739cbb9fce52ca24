"""The ledger across a job's attempts and ``--on-hang terminate``, shown end to end.

1. A job that crashes twice and hangs once (tests/restarting_job.py: verl's checkpoint and
   resume lines, a save every 3 steps), each attempt under ``verl-monitor run`` with one run
   store, started again after each failure as a scheduler's retry would; the hang ended by
   ``--on-hang terminate`` once it held ``--after`` seconds. Prints ``analyze``'s attempts
   section of the one log (with the store's events), the terminate's words, and the store's
   hand-checkable numbers against the job's own clock.
2. ``--on-hang terminate``'s decision replayed on the real verl recordings
   (tests/fixtures/real_verl, py-spy rounds every 10 s) at the hold given: when it fires on
   the hangs, and the guard that refuses it elsewhere (a flag forced open at every silence).

Usage: ``python bench/attempts_job.py [--after 3] [--replay-hold 20] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monitor.cli import main as cli  # noqa: E402
from monitor.hang.stacks import stacks_report  # noqa: E402
from monitor.hang.terminate import HangPolicy, decide  # noqa: E402
from monitor.logs.files import parse_file  # noqa: E402
from monitor.records import Flag  # noqa: E402
from monitor.store import RunStore  # noqa: E402

PLAN = "crash:5,crash:8,hang:10,finish"
FIXTURES = ROOT / "tests" / "fixtures" / "real_verl"
HANGS = ("hang_data", "hang_reward", "hang_http", "hang_data_live", "hang_reward_live",
         "hang_http_live")


def run_job(work: Path, after: float) -> None:
    """Four attempts of the job under ``verl-monitor run``; prints what each surface says."""
    cli_path = shutil.which("verl-monitor", path=str(Path(sys.executable).parent))
    cfg = work / "cfg.yaml"
    cfg.write_text("hang:\n  min_seconds: 1.0\n")
    exporter = (f"--gpu-backend sim --sim-gpus 1 --store {work / 'run.db'} --interval 0.5 "
                f"--detect-interval 1 --config {cfg} --on-hang-after {after} "
                "--on-hang-restack 1 --on-hang-grace 2")
    for k in range(len(PLAN.split(","))):
        rc = subprocess.run([cli_path, "run", "--log", str(work / "train.log"),
                             "--listen-address", "127.0.0.1:0", "--on-hang", "terminate",
                             "--exporter-args", exporter, "--", sys.executable,
                             str(ROOT / "tests" / "restarting_job.py"), "--state",
                             str(work / "state"), "--plan", PLAN],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        print(f"attempt {k + 1}: verl-monitor run exited {rc}")
    with contextlib.redirect_stdout(io.StringIO()):
        cli(["export", str(work / "run.db"), "--out", str(work / "rec")])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli(["analyze", str(work / "train.log"), "--events", str(work / "rec" / "events.json")])
    text = out.getvalue()
    print("\n".join(text.split("Attempts of the job\n")[1].split("\n\n")[0].splitlines()))
    store = RunStore(work / "run.db", create=False)
    for e in store.events(kind="hang_action"):
        print(f"\nhang_action (acted={e.data['acted']}): {e.message}")


def _from(flag: Flag):
    def flag_at(t: float) -> Flag | None:
        return flag if t >= flag.start else None
    return flag_at


def _forced(steps):
    def flag_at(t: float) -> Flag:
        last = max((float(s.end_time) for s in steps if s.end_time <= t), default=t - 1.0)
        return Flag("hang", "critical", last, None, {}, "forced", [])
    return flag_at


def replay(hold: float, hangs: bool = True) -> None:
    """The decision at each recorded round of every real recording (``hangs``: the hang
    recordings too, with their own flag; the others get a flag forced open at each silence)."""
    policy = HangPolicy(after_s=hold, restack_s=10.0)
    print(f"\nreplays of tests/fixtures/real_verl at --on-hang-after {hold:g} "
          "(--on-hang-restack 10):")
    for run in sorted(p.name for p in FIXTURES.iterdir() if (p / "meta.json").exists()):
        if run in HANGS and not hangs:
            continue
        d = FIXTURES / run
        steps = parse_file(d / "train.log").steps
        rounds = stacks_report(d / "stacks")[1]
        if run in HANGS:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                cli(["analyze", str(d / "train.log"), "--gpu", str(d / "gpu.csv"), "--host",
                     str(d / "host.csv"), "--events", str(d / "events.json"), "--stacks",
                     str(d / "stacks"), "--json"])
            f = next(x for x in json.loads(out.getvalue())["flags"] if x["kind"] == "hang")
            flag_at = _from(Flag("hang", "critical", f["start"], None, {}, f["evidence"], []))
        else:
            flag_at = _forced(steps)
        decisions = [(float(r.time), decide(flag_at(float(r.time)),
                                            [e for e in rounds if e.time <= r.time],
                                            [s for s in steps if s.end_time <= r.time],
                                            float(r.time), policy)) for r in rounds]
        acted = [(t, dd) for t, dd in decisions if dd.act]
        if acted:
            t, dd = acted[0]
            print(f"  {run}: fires {t - flag_at(t).start:.0f} s after the flag: {dd.why}")
        else:
            guards = sorted({dd.guard for _, dd in decisions})
            print(f"  {run}: never fires ({len(decisions)} rounds; guards that refused: "
                  f"{', '.join(guards)})")


def booking_cost(n: int = 10_000) -> None:
    """What the exporter's attempts view costs on a run store of ``n`` steps (60 metrics
    each, a tqdm line each): its first booking reads the whole store, the next ones what
    came since."""
    import time

    from exporters.options import ExporterOptions
    from monitor.live import ViewContext
    from monitor.live.attempt_counter import AttemptsView
    from monitor.live.rolling_window import RollingWindow
    from monitor.records import Event, StepRecord

    work = Path(tempfile.mkdtemp(prefix="attempts_cost_"))

    def step(k: int) -> StepRecord:
        return StepRecord(k, 1000.0 + 12 * k, 10.0, {"gen": 5.0, "update_actor": 5.0},
                          metrics={f"m{i}": i * 0.1 for i in range(60)}, time_source="arrival")

    store = RunStore(work / "run.db")
    store.add_steps([step(k) for k in range(1, n + 1)])
    store.add_events([Event("progress", 1000.0 + 12 * k, k, "", {"current": k, "total": n})
                      for k in range(1, n + 1)])
    window = RollingWindow()
    view = AttemptsView(ViewContext(node="n0", interval=1.0, window=window,
                                    options=ExporterOptions(store=str(work / "run.db"))))
    t0 = time.perf_counter()
    view.poll(2e9)
    first = time.perf_counter() - t0
    store.add_steps([step(n + 1)])
    window.add_steps([step(n + 1)])
    t0 = time.perf_counter()
    view.poll(2e9 + 20)
    nxt = time.perf_counter() - t0
    print(f"\nattempts view on a store of {n} steps: first booking {first:.3f} s, the next "
          f"(one new step) {nxt:.3f} s; booked at most every 10 s, and only on new steps or "
          f"marks: {nxt / 10 * 100:.1f}% of a core at most")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--after", type=float, default=3.0)
    p.add_argument("--replay-hold", type=float, default=20.0)
    p.add_argument("--keep", metavar="DIR")
    a = p.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="attempts_job_"))
    work.mkdir(parents=True, exist_ok=True)
    run_job(work, a.after)
    replay(a.replay_hold)
    replay(600.0)
    replay(0.0, hangs=False)  # no hold at all: what the other guards do alone
    booking_cost()
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
