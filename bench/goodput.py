"""The goodput ledger on the real-GPU recordings: does each injected fault grow its own cause?

For every run under ``tests/fixtures/real_gpu`` (the verl-shaped job on 1 and 2 H200s, see
tests/test_real_gpu.py) this runs :func:`monitor.analysis.goodput.ledger` and prints each cause's
GPU-seconds. For a fault run it compares the growth of the fault's own cause over the faulty
steps (their sum less the faulty steps' count times the median of the clean steps, step 1 being
warm-up) with the amount injected, as measured independently of the ledger:

* data_stall: ~5 s of CPU work per batch (the workload's setting) x faulty steps x GPUs;
* slow_sync: the growth of ``timing_s/update_weights`` (the sync) x GPUs;
* straggler: the growth of ``timing_s/update_actor`` x the waiting GPUs (all but one);
* long_tail: the growth of ``timing_s/gen`` x the waiting GPUs;
* big_collectives: the growth of ``timing_s/update_actor`` x GPUs (every GPU all-reduces);
* tiny_micro: the growth of the log-prob, ref and update phases x GPUs;
* contention: the growth of the training phases and of ``adv`` x the waiting GPUs, against
  straggler_wait. ``adv`` is counted because it grows from 0 to 0.54 s on exactly the faulty
  steps (the driver's advantage step waits on the slowed rank), and the laid-out timeline puts
  the samples of that wait into the neighbouring training phases; without it the ratio is
  1.22. In gen both ranks slow down together at decoding-like activity (a blind spot, see
  docs/goodput.md), so gen's growth is left out;
* long_tail on one GPU: the growth of ``timing_s/gen``, against low_activity (no peer waits);
* oom, nccl_hang (the job dies): from the last step line to the end of the job x GPUs,
  against restarts.

A fault passes when the growth is within +-20% of the injected amount; a healthy run passes
when its unattributed share is under 5%. Every run must add up within 2%.

    .venv/bin/python bench/goodput.py [--out bench/results/goodput_<date>_H200.txt]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monitor.analysis.goodput import CAUSES, imbalance, ledger, totals  # noqa: E402
from monitor.commands.analyze import merge_events, read_events  # noqa: E402
from monitor.frames import read_gpu_frame  # noqa: E402
from monitor.logs.parse import parse_file  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "real_gpu"
TOLERANCE = 0.20
HEALTHY_UNATTRIBUTED_MAX = 0.05
SUM_TOLERANCE = 0.02
DATA_STALL_S = 5.0  # bench/gpu_workload/faults.py: the DataLoader's extra CPU work per batch

#: scenario -> (the causes that must grow, the timers whose growth is the injected amount,
#: "all" GPUs or the "waiters")
EXPECT: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "data_stall": (("data_loading",), (), "all"),
    "slow_sync": (("weight_sync",), ("reshard",), "all"),
    "straggler": (("straggler_wait",), ("update_actor",), "waiters"),
    "long_tail": (("rollout_long_tail",), ("gen",), "waiters"),
    "big_collectives": (("communication",), ("update_actor",), "all"),
    "tiny_micro": (("low_activity",), ("old_log_prob", "ref", "update_actor"), "all"),
    "contention": (("straggler_wait",), ("old_log_prob", "ref", "adv", "update_actor"),
                   "waiters"),
}
#: On one GPU there is no peer to wait for: a long tail is the one GPU decoding a few long
#: sequences at low SM activity, which the ledger names low_activity.
EXPECT_ONE_GPU: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "long_tail": (("low_activity",), ("gen",), "all"),
}


#: Faults the ledger cannot see on one GPU (docs/goodput.md, blind spots): reported, not judged.
BLIND_ONE_GPU: dict[str, str] = {
    "contention": "blind: co-tenant's kernels read as busy",
}


def load(run: str) -> tuple[dict, list, pd.DataFrame, list]:
    """truth, steps, GPU samples and events of one recording."""
    d = FIXTURES / run
    truth = json.loads((d / "truth.json").read_text())
    parsed = parse_file(str(d / "train.jsonl"))
    console = parse_file(str(d / "train.log"), log_end=truth["job_end"])
    events = merge_events(merge_events(parsed.events, read_events(str(d / "events.json"))),
                          console.events)
    return truth, parsed.steps, read_gpu_frame(d / "gpu.csv"), events


def growth(per_step: pd.Series, fault: list[int], clean: list[int]) -> float:
    """Sum over the faulty steps less their count times the clean steps' median."""
    base = float(per_step.reindex(clean).median()) if clean else 0.0
    return float(per_step.reindex(fault).fillna(0.0).sum() - len(fault) * base)


def judge(run: str) -> dict:
    """The ledger of one run and its check against what was injected."""
    truth, steps, gpu, events = load(run)
    run_end = truth["job_end"] if truth["fatal"] else None
    led = ledger(steps, gpu, events, run_end=run_end)
    tot = totals(led)
    name, gpus = truth["name"], int(truth["gpus"])
    logged = sorted({s.step for s in steps})
    out = {"run": run, "name": name, "gpus": gpus, "totals": tot, "imbalance": imbalance(led)}
    if name == "healthy":
        share = tot["unattributed"] / tot["gpu_seconds_total"]
        out.update(check="unattributed share", injected=None, measured=share,
                   ok=share < HEALTHY_UNATTRIBUTED_MAX)
        steady = totals(led[led["step"] != logged[0]])  # after the warm-up step
        lost = sorted(steady["lost"].items(), key=lambda kv: -kv[1])[:3]
        out["healthy_note"] = (
            f"{run}: goodput {100 * tot['goodput_share']:.1f}% ({100 * steady['goodput_share']:.1f}%"
            " after the warm-up step); largest losses after it: "
            + ", ".join(f"{c} {100 * v / steady['gpu_seconds_total']:.1f}%" for c, v in lost)
            + f", unattributed {100 * steady['unattributed'] / steady['gpu_seconds_total']:.1f}%")
    elif name in ("oom", "nccl_hang"):
        last = max(s.end_time for s in steps)
        injected = (truth["job_end"] - last) * gpus
        measured = float(led[led["end"] > last + 1e-6]["restarts"].sum())
        out.update(check="restarts (crash tail)", injected=injected, measured=measured,
                   ok=abs(measured - injected) <= TOLERANCE * injected)
    elif gpus == 1 and name in BLIND_ONE_GPU:
        out.update(check=BLIND_ONE_GPU[name], injected=None, measured=None, ok=True, blind=True)
    elif name in EXPECT:
        causes, timers, who = (EXPECT_ONE_GPU.get(name) if gpus == 1 else None) or EXPECT[name]
        lo, hi = truth["steps"]
        fault = [s for s in logged if lo <= s <= hi]
        clean = [s for s in logged if s not in fault and s != logged[0]]
        per_step = led.groupby("step")[list(causes)].sum().sum(axis=1)
        measured = growth(per_step, fault, clean)
        mult = gpus if who == "all" else gpus - 1
        if name == "data_stall":
            injected = DATA_STALL_S * len(fault) * mult
        else:
            ph = pd.Series({s.step: sum(float(s.phases.get(t) or 0.0) for t in timers)
                            for s in steps})
            injected = growth(ph, fault, clean) * mult
        out.update(check="+".join(causes), injected=injected, measured=measured,
                   ok=bool(injected > 0 and abs(measured - injected) <= TOLERANCE * injected))
    else:
        out.update(check="(no rule)", injected=None, measured=None, ok=True)
    out["ok"] = bool(out["ok"] and out["imbalance"] <= SUM_TOLERANCE)
    return out


def table(results: list[dict]) -> str:
    """The per-scenario cause table and the checks, as printed."""
    lines = []
    short = {"productive": "prod", "data_loading": "data", "rollout_long_tail": "tail",
             "straggler_wait": "strag", "weight_sync": "sync", "communication": "comm",
             "cpu_phases": "cpu", "validation_checkpoint": "val/ckpt",
             "low_activity": "lowact", "restarts": "restart", "unattributed": "unattr",
             "waiting_for_samples": "w.smpl", "waiting_for_weights": "w.wts",
             "parameter_sync": "psync", "preempted_work": "preempt"}
    head = f"{'run':<22}{'total':>8}" + "".join(f"{short[c]:>9}" for c in CAUSES) + f"{'sum err':>9}"
    lines += ["GPU-seconds by cause (wall x GPUs)", head, "-" * len(head)]
    for r in results:
        t = r["totals"]
        vals = [t["productive"], *t["lost"].values(), t["unattributed"]]
        lines.append(f"{r['run']:<22}{t['gpu_seconds_total']:>8.1f}"
                     + "".join(f"{v:>9.1f}" for v in vals) + f"{100 * r['imbalance']:>8.3f}%")
    lines += ["", "Injected fault vs its own cause's growth over the faulty steps "
              f"(pass: within +-{int(TOLERANCE * 100)}%; healthy: unattributed < "
              f"{int(HEALTHY_UNATTRIBUTED_MAX * 100)}%)",
              f"{'run':<22}{'cause':<36}{'injected':>10}{'ledger':>10}{'ratio':>8}  result"]
    for r in results:
        if r["injected"] is None:
            meas = "" if r["measured"] is None else f"{100 * r['measured']:.1f}%"
            verdict = "BLIND" if r.get("blind") else "PASS" if r["ok"] else "FAIL"
            lines.append(f"{r['run']:<22}{r['check']:<36}{'':>10}{meas:>10}{'':>8}  {verdict}")
            continue
        ratio = r["measured"] / r["injected"] if r["injected"] else np.nan
        lines.append(f"{r['run']:<22}{r['check']:<36}{r['injected']:>10.2f}{r['measured']:>10.2f}"
                     f"{ratio:>8.2f}  {'PASS' if r['ok'] else 'FAIL'}")
    notes = [r["healthy_note"] for r in results if r.get("healthy_note")]
    if notes:
        lines += ["", "Healthy runs:", *notes]
    judged = [r for r in results if not r.get("blind")]
    npass = sum(r["ok"] for r in judged)
    blind = len(results) - len(judged)
    lines += ["", f"{npass}/{len(judged)} runs pass"
              + (f" ({blind} blind spot(s) not judged)" if blind else "") + "; largest sum error "
              f"{100 * max(r['imbalance'] for r in results):.4f}%"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the ledger on every recording, print the table, optionally write it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--run", action="append", help="only these recordings (folder names)")
    args = ap.parse_args(argv)
    runs = args.run or sorted(p.name for p in FIXTURES.iterdir() if (p / "truth.json").exists())
    results = [judge(r) for r in runs]
    text = table(results)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
