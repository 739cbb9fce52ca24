"""How soon a hang is named: the real verl recordings and a verl-shaped job with long steps.

1. ``real``: each recording of ``tests/fixtures/real_verl`` (verl on the H200: a reward that
   sleeps, one waiting on HTTP, a blocked data loader; and the healthy runs beside them) judged
   by ``verl-monitor analyze LOG --gpu --host --events --stacks --json``: the hang flag's start
   after the fault was injected and after the last progress, and the alarms of the healthy ones.
2. ``long``: a verl-shaped job in simulated time (``monitor/sim/hang_timeline.py``: a 90 s
   generation, a 0.8 s reward, log-probs and the update, a 3-minute validation and a 2-minute
   checkpoint), its reward blocked at step 6, with steps of about 110 s and of about 5 minutes.
   ``before``: the exporter of the day before issue 39 took py-spy rounds only in a silence
   (at ``stack_limit``, then every ``restack_s``); ``after``: the steady readings of
   ``monitor.hang.sampler`` (where that module exists).

Run it against another checkout to compare (its ``monitor`` package is imported; the timeline
comes from this file's checkout)::

    .venv/bin/python bench/hang_latency.py                       # this checkout
    /work/main/.venv/bin/python bench/hang_latency.py --monitor-root /work/main
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
HANGS = ("hang_reward", "hang_http", "hang_data", "hang_reward_live", "hang_http_live",
         "hang_data_live")
QUIET = ("healthy", "healthy_val", "healthy_val_ckpt", "cpu_reward")


def _analyze(folder: Path) -> dict:
    from monitor.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli(["analyze", str(folder / "train.log"), "--gpu", str(folder / "gpu.csv"), "--host",
             str(folder / "host.csv"), "--events", str(folder / "events.json"), "--stacks",
             str(folder / "stacks"), "--json"])
    return json.loads(out.getvalue())


def real(fixtures: Path) -> list[str]:
    """One line per recording: the hang flag's delay, or the healthy ones' alarms."""
    lines = []
    for run in HANGS + QUIET:
        d = fixtures / run
        doc, meta = _analyze(d), json.loads((d / "meta.json").read_text())
        alarms = [f for f in doc["flags"] if f["severity"] in ("warning", "critical")
                  and f["kind"] != "skipped_updates"]
        if run in QUIET:
            lines.append(f"{run:18s} alarms: {[f['kind'] for f in alarms] or 'none'}")
            continue
        hang = next((f for f in alarms if f["kind"] == "hang"), None)
        injected = next(v["ts"] for v in meta["injected"].values() if "ts" in v)
        if hang is None:
            lines.append(f"{run:18s} no hang flag")
            continue
        last = max(s["end_time"] for s in doc["steps"] if s["end_time"] <= hang["start"])
        lines.append(f"{run:18s} hang named {hang['start'] - last:5.1f} s after the last "
                     f"progress, {hang['start'] - injected:5.1f} s after the fault "
                     f"(other alarms: {[f['kind'] for f in alarms if f is not hang] or 'none'})")
    return lines


def _timeline_module():
    path = HERE / "monitor" / "sim" / "hang_timeline.py"
    spec = importlib.util.spec_from_file_location("hang_timeline_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _flag(tl, events, now: float):
    from monitor.detect import make_context
    from monitor.detect.hang import detect_hang

    ctx = make_context(tl.steps_until(now), tl.gpu_frame(now), None, list(events), now=now)
    hangs = [f for f in detect_hang(ctx) if f.kind == "hang"]
    return hangs[0] if hangs else None


def silence_rounds(tl, now: float) -> list:
    """The rounds the exporter took before issue 39: in the silence after the last step, at
    ``stack_limit`` of the recent step time, then every ``restack_s`` until one says stuck."""
    from monitor.config import load_config
    from monitor.detect.hang import recent_step_time, stack_limit

    cfg = load_config(None).section("hang")
    steps = tl.steps_until(now)
    last = float(steps[-1].end_time)
    t = last + stack_limit(recent_step_time(steps), cfg)
    events = []
    while t < now:
        got = tl.round(t)
        events.append(got.to_event(t, "n0"))
        if got.verdict.stuck:
            break
        t += cfg.get_float("restack_s", 30.0)
    return events


def steady_rounds(tl, now: float) -> list | None:
    """The over-events of the steady readings (None where ``monitor.hang.sampler`` is not)."""
    try:
        from monitor.hang.dwell import HoldLimits
        from monitor.hang.procs import JobProcess
        from monitor.hang.sampler import HoldSampler
    except ImportError:
        return None
    from monitor.config import load_config

    cfg = load_config(None).section("hang")
    sampler = HoldSampler(HoldLimits.from_config(cfg), cfg.get_float("sample_s", 10.0))
    procs = [JobProcess(1001, "driver", "tree"), JobProcess(1002, "worker", "ray")]
    events, t = [], tl.t0 + 0.5
    while t < now:
        sampler.add_steps(tl.steps_until(t))
        if sampler.due(t):
            events += sampler.run(t, procs, lambda ps, full, t=t: tl.round(t, full))
        t += 1.0
    return events


def long_steps() -> list[str]:
    """The long-step job: when its blocked reward is named, before and after."""
    mod = _timeline_module()
    lines = []
    for label, scale in (("110 s steps", 1.0), ("5-minute steps", 3.0)):
        phases = tuple((p, s * scale) for p, s in mod.STEP_PHASES)
        tl = mod.JobTimeline(phases=phases)
        now = tl.blocked_at + 3600.0
        last = float(tl.steps_until(now)[-1].end_time)
        for name, events in (("before (rounds in the silence)", silence_rounds(tl, now)),
                             ("after (steady readings)", steady_rounds(tl, now))):
            if events is None:
                lines.append(f"{label:15s} {name:32s} n/a in this checkout")
                continue
            f = _flag(tl, events, now)
            lines.append(f"{label:15s} {name:32s} " + (
                "no hang flag" if f is None else
                f"named {f.start - tl.blocked_at:6.1f} s after the reward blocked "
                f"({f.start - last:6.1f} s after the last step)"))
        healthy = mod.JobTimeline(phases=phases, block_step=0)
        quiet = steady_rounds(healthy, healthy.end + 60.0)
        if quiet is not None:
            f = _flag(healthy, quiet, healthy.end + 60.0)
            lines.append(f"{label:15s} {'healthy (val 3 min, ckpt 2 min)':32s} "
                         + ("no hang flag" if f is None else f"FLAG at {f.start - tl.t0:.0f} s"))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print both tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--monitor-root", default=str(HERE),
                    help="the checkout whose monitor package judges (default: this one)")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.monitor_root)
    import subprocess

    commit = subprocess.run(["git", "-C", args.monitor_root, "log", "--oneline", "-1"],
                            capture_output=True, text=True).stdout.strip()
    print(f"monitor: {args.monitor_root} at {commit}")
    print("\n== real verl on the H200 (tests/fixtures/real_verl), analyze --stacks")
    print("\n".join(real(HERE / "tests" / "fixtures" / "real_verl")))
    print("\n== a verl-shaped job with long steps (simulated time), reward blocked at step 6")
    print("\n".join(long_steps()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
