"""Detection quality, measured: precision, recall and latency per flag kind over simulated runs.

Every simulator scenario runs over several seeds, noise levels, node counts, verl versions and
log formats. Each run goes through the whole user path: ``SimRun.write(dir)`` writes
``train.log``, ``gpu.csv`` and ``host.csv``; the log is parsed with ``parse_file``, the CSVs read
with ``read_gpu_frame``/``read_host_frame``, and ``run_all`` gives the flags. The exporter also
passes per-GPU ``up``/``xid``/``clock_events`` readings that the CSV does not hold; those come
from the simulator's GPU samples at the same instants (``--no-extras`` leaves them out).

A flag matches a truth entry when the kinds match and the time ranges overlap. Per kind:
precision = matching flags / all flags; recall = truth entries with a matching flag / all
truth entries; latency = first matching flag's start - injected onset. "aim" is the latency
allowed: three sampling intervals plus the detector's persistence window (for
step_time_spikes, up to the second spike's confirming step). Healthy runs count every
warning or critical flag as a false flag.

    .venv/bin/python bench/detection.py --quick        # about a minute on 2 cores
    .venv/bin/python bench/detection.py                # the full matrix
    .venv/bin/python bench/detection.py --seeds 2 --json bench/results/detection.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from monitor.config import load_config  # noqa: E402
from monitor.detect import run_all  # noqa: E402
from monitor.frames import read_gpu_frame, read_host_frame, read_rollout_frame  # noqa: E402
from monitor.logs.canonical_records import parse_file  # noqa: E402
from monitor.records import FLAG_KINDS  # noqa: E402
from monitor.sim.engine import SimRun  # noqa: E402
from monitor.sim.scenarios import SCENARIOS, GpuFault  # noqa: E402

VERSIONS = ("0.4.1", "0.6", "0.7.1", "0.9")
SAMPLE_INTERVAL = 1.0  # SimRun.write samples GPUs and hosts every second


@dataclass(frozen=True)
class Case:
    """One simulated run of the matrix."""

    scenario: str
    seed: int
    version: str
    nodes: int
    noise: float
    log_format: str = "console"
    timestamps: bool = False
    steps: int = 40
    step_seconds: float = 30.0
    extras: bool = True

    @property
    def label(self) -> str:
        """Short description for tables."""
        return (f"{self.scenario} v{self.version} n{self.nodes} noise{self.noise:g} "
                f"{self.log_format}{' ts' if self.timestamps else ''} seed{self.seed}")


def scenario_names() -> list[str]:
    """Every simulator scenario, plus gpu_fault in its "down" mode."""
    return [*SCENARIOS, "gpu_fault_down"]


def _needs_server_mode(name: str) -> bool:
    """Whether the scenario plays one of today's trainers (agent loop, split pools): the
    simulator writes those only as verl 0.6+ console logs."""
    sc = SCENARIOS.get(name)
    return getattr(sc, "trainer_mode", None) not in (None, "sync")


def _scenario(name: str):
    if name == "gpu_fault_down":
        return GpuFault(mode="down")
    return name


def build_cases(seeds: int, quick: bool, steps: int, extras: bool) -> list[Case]:
    """The run matrix: every scenario over versions, node counts, noise, formats and seeds."""
    combos: list[tuple[str, int, float, str, bool]] = []
    if quick:
        combos = [("0.4.1", 1, 1.0, "console", False), ("0.6", 2, 1.5, "console", True),
                  ("0.7.1", 1, 1.5, "breakdown", False), ("0.9", 2, 1.0, "console", False)]
    else:
        for version in VERSIONS:
            for nodes in (1, 2):
                for noise in (1.0, 2.0):
                    combos.append((version, nodes, noise, "console", nodes == 2 and noise == 1.0))
        combos += [("0.7.1", 1, 1.0, "breakdown", False), ("0.7.1", 2, 2.0, "breakdown", True)]
    cases = []
    for si, name in enumerate(scenario_names()):
        modern = _needs_server_mode(name)
        for seed in range(seeds):
            for ci, (version, nodes, noise, fmt, ts) in enumerate(combos):
                if modern and (fmt != "console" or version in ("0.4.1",)):
                    continue  # today's trainers print verl 0.6+ console lines only
                cases.append(Case(name, 1000 * seed + 17 * si + ci, version, nodes, noise, fmt,
                                  ts, steps, 30.0, extras))
    return cases


def _extras(run: SimRun, gpu: pd.DataFrame) -> pd.DataFrame:
    """The exporter's per-GPU extras (up, xid counts, clock events) at the frame's instants."""
    rows = []
    for t in np.unique(gpu["ts"].to_numpy(float)):
        for r in run.gpu_sample_at(float(t)):
            rows.append((float(t), str(r["node"]), int(r["gpu"]), bool(r["up"]),
                         dict(r["xid"]), dict(r["clock_events"])))
    extra = pd.DataFrame(rows, columns=["ts", "node", "gpu", "up", "xid", "clock_events"])
    gpu = gpu.assign(gpu=gpu["gpu"].astype(int))
    return gpu.merge(extra, on=["ts", "node", "gpu"], how="left")


def run_case(case: Case) -> dict[str, Any]:
    """Simulate, write, parse, read and detect one case; return its truth and flags."""
    t0 = time.perf_counter()
    run = SimRun(_scenario(case.scenario), steps=case.steps, nodes=case.nodes, seed=case.seed,
                 verl_version=case.version, noise=case.noise, log_format=case.log_format,
                 timestamps=case.timestamps, step_seconds=case.step_seconds)
    with tempfile.TemporaryDirectory(prefix="verlmon-bench-") as tmp:
        run.write(tmp)
        parsed = parse_file(Path(tmp) / "train.log")
        gpu = read_gpu_frame(Path(tmp) / "gpu.csv")
        host = read_host_frame(Path(tmp) / "host.csv")
        rollout = (read_rollout_frame(Path(tmp) / "rollout.csv")
                   if (Path(tmp) / "rollout.csv").exists() else None)
    if case.extras:
        gpu = _extras(run, gpu)
    t1 = time.perf_counter()
    flags = run_all(parsed.steps, gpu, host, parsed.events, config=load_config(),
                    rollout=rollout, actors=parsed.actors)
    t2 = time.perf_counter()
    return {
        "case": case.__dict__,
        "label": case.label,
        "start_time": run.start_time,
        "truth": [{k: e[k] for k in ("kind", "start", "end", "scope", "needs") if k in e}
                  | {"spike_steps": e.get("spike_steps", [])} for e in run.truth],
        "step_ends": {st.step: st.end for st in run.steps},
        "flags": [f.to_dict() for f in flags],
        "sim_s": t1 - t0,
        "detect_s": t2 - t1,
    }


def _overlap(flag: dict[str, Any], truth: dict[str, Any]) -> bool:
    f_end = flag["end"] if flag["end"] is not None else math.inf
    return flag["start"] <= truth["end"] and truth["start"] <= f_end


def persistence_seconds(kind: str, step_s: float) -> float:
    """The persistence window of a kind's detector, in seconds, from the default config."""
    cfg = load_config()
    sec = cfg.section(kind)
    windows = 1.0
    if "open_after_steps" in sec:
        windows = float(sec["open_after_steps"])
    elif "open_after_s" in sec:
        windows = max(1.0, math.floor(float(sec["open_after_s"]) / step_s + 0.5))
    if kind in ("stalled", "hang"):
        return max(float(sec["median_multiple"]) * step_s, float(sec["min_seconds"]))
    if kind == "oom":
        return 0.0
    if kind == "gpu_fault":
        return float(sec["open_after_s"])
    if kind == "io_starvation":
        windows = min(windows, float(sec["open_after_steps"]))
    return windows * step_s


def persistence_steps(kind: str) -> int:
    """How many steps (analysis windows) a kind's persistence spans; 0 for time-only kinds."""
    if kind in ("oom", "gpu_fault", "stalled", "step_time_spikes"):
        return 0
    return max(1, round(persistence_seconds(kind, 30.0) / 30.0))


def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-kind precision, recall and latency, and false flags on healthy runs."""
    per: dict[str, dict[str, Any]] = {k: {"truths": 0, "found": 0, "flags": 0, "true_flags": 0,
                                          "latency": [], "late": 0, "missed": [], "false": []}
                                      for k in FLAG_KINDS}
    healthy_false: list[str] = []
    for res in results:
        step_s = float(res["case"]["step_seconds"])
        if not res["case"].get("timestamps"):
            # a truth visible only with line timestamps or arrival times (a data stall before
            # the step timer) is not expected from a log without them; and while it lasts the
            # step times rebuilt from the log no longer line up with the GPU samples, so no
            # flag overlapping it is judged either
            hidden = [t for t in res["truth"] if t.get("needs") == "times"]
            res = dict(res, truth=[t for t in res["truth"] if t.get("needs") != "times"],
                       flags=[f for f in res["flags"]
                              if not any(_overlap(f, t) for t in hidden)])
        for f in res["flags"]:
            k = f["kind"]
            per[k]["flags"] += 1
            if any(t["kind"] == k and _overlap(f, t) for t in res["truth"]):
                per[k]["true_flags"] += 1
            else:
                per[k]["false"].append(f"{res['label']}: {f['severity']} {f['evidence'][:120]}")
            if res["case"]["scenario"] == "healthy" and f["severity"] in ("warning", "critical"):
                healthy_false.append(f"{res['label']}: {k} {f['severity']}")
        for t in res["truth"]:
            k = t["kind"]
            per[k]["truths"] += 1
            hits = [f for f in res["flags"] if f["kind"] == k and _overlap(f, t)]
            if not hits:
                per[k]["missed"].append(res["label"])
                continue
            per[k]["found"] += 1
            lat = max(0.0, min(f["start"] for f in hits) - t["start"])
            per[k]["latency"].append(lat)
            aim = 3 * SAMPLE_INTERVAL + persistence_seconds(k, step_s)
            first = (t.get("scope") or {}).get("steps", [None])[0]
            n_win = persistence_steps(k)
            ends = res["step_ends"]
            if first is not None and n_win:
                last = ends.get(first + n_win - 1, ends.get(str(first + n_win - 1)))
                if last is not None:  # the persistence window in the run's actual step times
                    aim = max(aim, last - t["start"] + 3 * SAMPLE_INTERVAL)
            if k == "step_time_spikes" and len(t.get("spike_steps", [])) >= 2:
                second = t["spike_steps"][1]
                ends = res["step_ends"]
                confirm = ends.get(second + 1, ends.get(str(second + 1)))
                if confirm is not None:
                    aim = confirm - t["start"] + 3 * SAMPLE_INTERVAL
            if lat > aim + 1e-6:
                per[k]["late"] += 1
    return {"per_kind": per, "healthy_false": healthy_false}


def print_table(summary: dict[str, Any], results: list[dict[str, Any]], wall: float) -> None:
    """The per-kind table and the healthy-run line."""
    per = summary["per_kind"]
    hdr = (f"{'kind':22s} {'truths':>6s} {'recall':>7s} {'flags':>6s} {'precision':>9s} "
           f"{'lat p50':>8s} {'lat max':>8s} {'aim':>6s} {'late':>5s}")
    print(hdr)
    print("-" * len(hdr))
    for k in FLAG_KINDS:
        p = per[k]
        rec = p["found"] / p["truths"] if p["truths"] else float("nan")
        prec = p["true_flags"] / p["flags"] if p["flags"] else float("nan")
        lat = p["latency"]
        p50 = f"{np.median(lat):.0f}s" if lat else "-"
        mx = f"{max(lat):.0f}s" if lat else "-"
        aim = f"{3 * SAMPLE_INTERVAL + persistence_seconds(k, 30.0):.0f}s"
        if k == "step_time_spikes":
            aim = "2nd"
        print(f"{k:22s} {p['truths']:6d} {rec:7.2f} {p['flags']:6d} {prec:9.2f} {p50:>8s} "
              f"{mx:>8s} {aim:>6s} {p['late']:5d}")
    n_healthy = sum(1 for r in results if r["case"]["scenario"] == "healthy")
    print(f"\nhealthy runs: {n_healthy}, warning/critical flags on them: "
          f"{len(summary['healthy_false'])}")
    for line in summary["healthy_false"][:10]:
        print("  ", line)
    det = [r["detect_s"] for r in results]
    print(f"runs: {len(results)}, wall {wall:.0f} s, detect per run p50 {np.median(det):.2f} s "
          f"max {max(det):.2f} s")


def print_misses(summary: dict[str, Any], limit: int = 6) -> None:
    """Where recall or precision fell short (first few of each)."""
    for k, p in summary["per_kind"].items():
        if p["missed"]:
            print(f"missed {k}: " + "; ".join(p["missed"][:limit]))
        if p["false"]:
            print(f"false {k}: " + " | ".join(p["false"][:limit]))


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds per scenario and combination (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help="four combinations (one per verl version, 1 and 2 nodes, both log "
                    "formats) instead of eighteen")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per simulated run (default 40; 30 with --quick)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="worker processes")
    ap.add_argument("--scenario", action="append", default=None,
                    help="only these scenarios (repeatable)")
    ap.add_argument("--no-extras", action="store_true",
                    help="CSV only: leave out the exporter's up/xid/clock_events columns")
    ap.add_argument("--json", default=None, help="write every flag and the scores here")
    ap.add_argument("--misses", action="store_true", help="list missed truths and false flags")
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else 1
    steps = args.steps if args.steps is not None else (30 if args.quick else 40)
    if seeds < 1 or steps < 20 or args.jobs < 1:
        print("detection.py: --seeds and --jobs must be >= 1, --steps >= 20", file=sys.stderr)
        return 2
    cases = build_cases(seeds, args.quick, steps, not args.no_extras)
    if args.scenario:
        unknown = sorted(set(args.scenario) - set(scenario_names()))
        if unknown:
            print(f"detection.py: unknown scenario(s) {', '.join(unknown)}; valid: "
                  f"{', '.join(scenario_names())}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.scenario in set(args.scenario)]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(run_case, cases, chunksize=1))
    else:
        results = [run_case(c) for c in cases]
    wall = time.perf_counter() - t0
    summary = score(results)
    print_table(summary, results, wall)
    if args.misses:
        print_misses(summary)
    if args.json:
        out = {"summary": {k: {kk: vv for kk, vv in v.items()}
                           for k, v in summary["per_kind"].items()},
               "healthy_false": summary["healthy_false"], "runs": results, "wall_s": wall}
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
