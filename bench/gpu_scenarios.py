"""Real faults on real GPUs: the verl-shaped job per scenario, watched by the real exporter.

For each scenario of ``bench/gpu_workload/faults.py``:

1. the exporter (``verl-monitor exporter``, NVML + GPM backend, NCCL Inspector dumps, a run
   store) starts and follows the job's log live;
2. the job (``python3 -m bench.gpu_workload.job``) runs with its output captured to that log,
   the NCCL Inspector plugin loaded when ``--inspector`` names it;
3. after the job ends the exporter gets one more detector pass, then stops; the store is
   exported (``verl-monitor export``) and analysed offline (``verl-monitor analyze --json``);
4. every flag raised, live (the store's flags) and offline, is scored against the scenario's
   truth: the right kind, the right scope (the faulty rank's GPU, the phase), the first step
   flagged against the fault's onset, and any warning or critical flag that should not be.

Writes ``gpu_scenarios_<date>_<gpu>.json`` and ``.txt`` and a ``recordings_<ngpu>gpu.tar.gz``
of each run's trimmed files (log, JSONL, gpu.csv, host.csv, nccl records, events, flags,
truth) to ``--out`` (default ``$OUT``, else ``bench/results``).

    # on the GPU machine (inspector built from NCCL's plugins/profiler/inspector)
    PYTHONUNBUFFERED=1 python3 bench/gpu_scenarios.py --gpus 1 --inspector PATH/libnccl-profiler-inspector.so
    # here, without a GPU: the same flow on the CPU (gloo, a tiny model, the sim GPU backend)
    .venv/bin/python bench/gpu_scenarios.py --dry-run --scenarios healthy,data_stall
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.exporter import stop_exporter  # noqa: E402
from bench.gpu_workload.faults import SCENARIOS, Scenario  # noqa: E402

#: Severities that count as raising the alarm.
ALARM = ("warning", "critical")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--scenarios", default="all", help="comma list, or 'all' (default)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--interval", type=float, default=0.2, help="exporter sampling interval")
    p.add_argument("--inspector", default=None, help="NCCL Inspector plugin .so")
    p.add_argument("--work", default="/tmp/gpu_scenarios", help="scratch folder")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results"))
    p.add_argument("--job-timeout", type=float, default=170.0)
    p.add_argument("--rescore", metavar="DIR", default=None,
                   help="analyse recorded runs under DIR again with this checkout (no GPU): "
                   "offline, and the live detector loop replayed step by step; print the table")
    p.add_argument("--make-fixtures", nargs=2, metavar=("SRC", "DEST"), default=None,
                   help="trim the recorded runs under SRC into test fixtures under DEST")
    p.add_argument("--budget-s", type=float, default=1e9,
                   help="skip scenarios that would end past this many seconds")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model, sim GPU backend")
    p.add_argument("--job-args", default="", help="extra arguments for the job")
    p.add_argument("--job-python", default=sys.executable,
                   help="python that has torch and transformers (default: this one)")
    return p.parse_args(argv)


def _monitor(*args: str) -> list[str]:
    return [sys.executable, "-m", "monitor", *args]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")


def run_one(scn: Scenario, ngpu: int, args: argparse.Namespace, port: int) -> dict[str, Any]:
    """One scenario end to end; returns its record for the results file."""
    run = Path(args.work) / f"{ngpu}gpu" / scn.name
    shutil.rmtree(run, ignore_errors=True)
    (run / "nccl").mkdir(parents=True)
    log = run / "train.log"
    log.touch()
    store = run / "store.db"
    exp_cmd = _monitor("exporter", "--listen-address", f"127.0.0.1:{port}",
                       "--interval", str(args.interval), "--log", str(log),
                       "--nccl-dir", str(run / "nccl"), "--store", str(store),
                       "--detect-interval", "2", "--node", "gpu-node",
                       "--gpu-backend", "sim" if args.dry_run else "nvml")
    if args.dry_run:
        exp_cmd += ["--scenario", "healthy", "--sim-gpus", str(ngpu)]
    exp_log = open(run / "exporter.log", "w")  # noqa: SIM115
    exporter = subprocess.Popen(exp_cmd, env=_env(), stdout=exp_log, stderr=subprocess.STDOUT,
                                cwd=str(ROOT))
    time.sleep(3.0)  # the exporter's first samples: a baseline before the job starts
    job_env = _env()
    if args.inspector and not args.dry_run:
        job_env.update(NCCL_PROFILER_PLUGIN=str(Path(args.inspector).resolve()),
                       NCCL_INSPECTOR_ENABLE="1", NCCL_INSPECTOR_DUMP_DIR=str(run / "nccl"),
                       NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS="500000",
                       NCCL_INSPECTOR_DUMP_VERBOSE="1")
    job_cmd = [args.job_python, "-m", "bench.gpu_workload.job", "--scenario", scn.name,
               "--gpus", str(ngpu), "--steps", str(args.steps),
               "--jsonl", str(run / "train.jsonl"), "--port", str(port + 1000)]
    if args.dry_run:
        job_cmd += ["--device", "cpu"]
    job_cmd += args.job_args.split()
    t_start = time.time()
    with open(log, "ab", buffering=0) as out:
        job = subprocess.Popen(job_cmd, env=job_env, stdout=out, stderr=subprocess.STDOUT,
                               cwd=str(ROOT), start_new_session=True)
        try:
            rc = job.wait(timeout=args.job_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            rc = job.wait()
            out.write(b"[gpu_scenarios] job killed after its timeout\n")
    t_end = time.time()
    time.sleep(4.0)  # one more detector pass on the last steps (--detect-interval 2)
    stop_exporter(exporter)
    exp_log.close()
    export = run / "export"
    subprocess.run(_monitor("export", str(store), "--out", str(export)), env=_env(),
                   cwd=str(ROOT), capture_output=True, text=True, check=False)
    offline = analyze(export, run)
    truth = scn.to_dict() | {"gpus": ngpu, "job_start": t_start, "job_end": t_end, "rc": rc,
                              "steps_run": args.steps, "interval_s": args.interval}
    (run / "truth.json").write_text(json.dumps(truth, indent=1))
    live_flags = _read_json(export / "flags.json", [])
    steps = _step_ends(export / "train.jsonl")
    rec = {"scenario": scn.name, "gpus": ngpu, "what": scn.what, "fault_steps": scn.steps,
           "fault_rank": None if scn.rank is None else scn.rank % ngpu, "rc": rc,
           "wall_s": round(t_end - t_start, 1), "steps_logged": len(steps),
           "live": score(scn, ngpu, live_flags, steps),
           "offline": score(scn, ngpu, offline.get("flags", []), steps),
           "offline_summary": _summary_bits(offline),
           "exporter_log_tail": (run / "exporter.log").read_text(errors="replace")[-600:]}
    return rec


def analyze(export: Path, run: Path) -> dict[str, Any]:
    """``verl-monitor analyze --json`` on the exported store (the step times it recorded)."""
    cmd = _monitor("analyze", str(export / "train.jsonl"), "--gpu", str(export / "gpu.csv"),
                   "--host", str(export / "host.csv"), "--events", str(export / "events.json"),
                   *(["--nccl", str(export / "nccl.csv")] if (export / "nccl.csv").exists()
                     else []),
                   "--json")
    res = subprocess.run(cmd, env=_env(), cwd=str(ROOT), capture_output=True, text=True,
                         check=False)
    (run / "analyze.json").write_text(res.stdout)
    txt = subprocess.run([c for c in cmd if c != "--json"], env=_env(), cwd=str(ROOT),
                         capture_output=True, text=True, check=False)
    (run / "analyze.txt").write_text(txt.stdout + txt.stderr)
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        return {"error": (res.stderr or res.stdout)[-400:]}


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return default


def _step_ends(path: Path) -> list[tuple[int, float]]:
    out = []
    try:
        for line in path.read_text().splitlines():
            o = json.loads(line)
            if o.get("ts") is not None:
                out.append((int(o["step"]), float(o["ts"])))
    except (OSError, json.JSONDecodeError, ValueError):
        pass
    return sorted(out, key=lambda x: x[1])


def _first_step(start: float, steps: list[tuple[int, float]]) -> int | None:
    """The step during which (or before whose end) a flag opened."""
    for step, end in steps:
        if start <= end + 0.5:
            return step
    return (steps[-1][0] + 1) if steps else None


def _gpus_of(scope: dict[str, Any]) -> list[int]:
    g = scope.get("gpus", scope.get("gpu"))
    if g is None or g == "":
        return []
    if isinstance(g, (list, tuple)):
        return [int(x) for x in g]
    return [int(x) for x in str(g).split(",") if x.strip().lstrip("-").isdigit()]


def score(scn: Scenario, ngpu: int, flags: list[dict[str, Any]],
          steps: list[tuple[int, float]]) -> dict[str, Any]:
    """Flags against the truth: caught (kind, scope, first step), and false alarms."""
    alarms = [f for f in flags if f.get("severity") in ALARM]
    rows = []
    for f in flags:
        rows.append({"kind": f.get("kind"), "severity": f.get("severity"),
                     "scope": f.get("scope", {}), "first_step": _first_step(
                         float(f.get("start") or 0), steps) if steps else None,
                     "evidence": (f.get("evidence") or "")[:300],
                     "advice": [a[:200] for a in (f.get("advice") or [])][:2]})
    fault_rank = None if scn.rank is None else scn.rank % ngpu
    hits = [r for r in rows if r["kind"] in scn.expect and r["severity"] in ALARM]
    caught = None
    for r in hits:
        ok_scope = True
        if scn.expect_scope.get("gpu") == "rank" and ngpu > 1:
            ok_scope = fault_rank in _gpus_of(r["scope"])
        if "phase" in scn.expect_scope and ngpu > 1:
            ok_scope = ok_scope and r["scope"].get("phase") in (scn.expect_scope["phase"], None)
        in_time = (scn.steps is None or r["first_step"] is None
                   or r["first_step"] <= scn.steps[0] + 3)
        cand = dict(r, scope_ok=ok_scope, in_time=in_time)
        if caught is None or (ok_scope and in_time and not (caught["scope_ok"] and caught["in_time"])):
            caught = cand
    false = [r for r in rows if r["severity"] in ALARM
             and r["kind"] not in scn.expect + scn.also]
    return {"flags": rows, "n_alarms": len(alarms),
            "caught": caught, "ok": (not scn.expect or bool(caught and caught["scope_ok"]
                                                           and caught["in_time"])) and not false,
            "false_alarms": false}


def _summary_bits(report: dict[str, Any]) -> dict[str, Any]:
    s = report.get("summary") or {}
    keep = {k: s[k] for k in ("steps", "wall_s", "step_s_sum", "data_wait", "phases")
            if k in s}
    if "error" in report:
        keep["error"] = report["error"]
    return keep


def table(records: list[dict[str, Any]]) -> str:
    """The results as text: one block per scenario, the verdict first."""
    lines = []
    for r in records:
        for mode in ("live", "replay", "offline"):
            if mode not in r:
                continue
            sc = r[mode]
            c = sc["caught"]
            got = (f"{c['kind']}/{c['severity']} scope={c['scope']} step {c['first_step']}"
                   if c else "-")
            verdict = "OK" if sc["ok"] else "MISS"
            lines.append(f"{r['gpus']}gpu {r['scenario']:<16} {mode:<7} {verdict:<4} "
                         f"fault steps={r['fault_steps']} rank={r['fault_rank']} -> {got}; "
                         f"false alarms: {[f['kind'] for f in sc['false_alarms']] or 'none'}")
    lines.append("")
    for r in records:
        lines.append(f"== {r['gpus']}gpu {r['scenario']}: {r['what']} (rc={r['rc']}, "
                     f"{r['steps_logged']} steps, {r['wall_s']} s)")
        for mode in ("live", "replay", "offline"):
            for f in r.get(mode, {}).get("flags", []):
                lines.append(f"  [{mode}] {f['kind']}/{f['severity']} {f['scope']} "
                             f"step {f['first_step']}: {f['evidence'][:220]}")
                for a in f["advice"][:1]:
                    lines.append(f"      advice: {a[:180]}")
    return "\n".join(lines) + "\n"


def write_results(records: list[dict[str, Any]], args: argparse.Namespace, gpu_name: str,
                  out: Path) -> None:
    """The results (.json, .txt) and the runs' recordings (.tar.gz), rewritten whole."""
    date = dt.date.today().isoformat()
    tag = gpu_name.replace("NVIDIA ", "").replace(" ", "_")
    stem = out / f"gpu_scenarios_{date}_{tag}_{args.gpus}gpu"
    meta = {"date": date, "gpu": gpu_name, "gpus": args.gpus, "steps": args.steps,
            "interval_s": args.interval, "inspector": bool(args.inspector)}
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": records}, indent=1,
                                                    default=str))
    stem.with_suffix(".txt").write_text(f"{meta}\n\n" + table(records))
    with tarfile.open(out / f"recordings_{args.gpus}gpu.tar.gz", "w:gz") as tar:
        for rec in records:
            run = Path(args.work) / f"{args.gpus}gpu" / rec["scenario"]
            for p in sorted(run.rglob("*")):
                if p.is_file() and p.name != "store.db" and not p.name.endswith(
                        ("-wal", "-shm", ".lock")):
                    tar.add(p, arcname=str(p.relative_to(Path(args.work))))


def nccl_per_rank(run: Path) -> list[dict[str, Any]]:
    """The Inspector's per-rank records of the run, trimmed to what shows who waits:
    one row per collective per rank (time, rank, collective, sequence number, bytes, exec us)."""
    rows = []
    for f in sorted((run / "nccl").glob("*.log")):
        with open(f, errors="replace") as fh:
            for line in fh:
                try:
                    o = json.loads(line)
                    h, c, m = o["header"], o["coll_perf"], o["metadata"]
                except (ValueError, KeyError, TypeError):
                    continue
                rows.append({"ts": m["dump_timestamp_us"] / 1e6, "rank": h["rank"],
                             "n_ranks": h["n_ranks"], "comm": h.get("comm_name"),
                             "coll": c["coll"], "sn": c["coll_sn"],
                             "bytes": c["coll_msg_size_bytes"],
                             "exec_us": c["coll_exec_time_us"]})
    return rows


def make_fixtures(src: Path, dest: Path) -> None:
    """Trimmed recordings for tests/fixtures/real_gpu: each run's exported files, its console
    log, truth, live flags and the Inspector's large collectives (>= 1 MB) per rank."""
    import csv

    for truth in sorted(src.rglob("truth.json")):
        run = truth.parent
        t = json.loads(truth.read_text())
        out = dest / f"{t['gpus']}gpu_{run.name}"
        out.mkdir(parents=True, exist_ok=True)
        for name in ("gpu.csv", "host.csv", "train.jsonl", "events.json", "nccl.csv"):
            if (run / "export" / name).exists():
                shutil.copy(run / "export" / name, out / name)
        shutil.copy(run / "export" / "flags.json", out / "flags_live.json")
        shutil.copy(run / "train.log", out / "train.log")
        keep = {k: t[k] for k in ("name", "what", "steps", "rank", "expect", "expect_scope",
                                  "gpus", "fatal", "job_start", "job_end", "rc")}
        (out / "truth.json").write_text(json.dumps(keep, indent=1) + "\n")
        rows = [r for r in nccl_per_rank(run) if r["bytes"] >= 1 << 20]
        if rows:
            with open(out / "nccl_large.csv", "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)


def replay_live(export: Path, run: Path) -> list[dict[str, Any]]:
    """The exporter's detector loop replayed with this checkout: after each step line (at the
    time the exporter saw it arrive, plus its 2 s detector interval) ``run_all`` on what had
    arrived by then, merged by ``FlagTracker`` as live. Returns every flag it opened."""
    from cli.commands.analyze import merge_events, read_events
    from monitor.config import load_config
    from monitor.detect import run_all
    from monitor.frames import empty_nccl_frame, read_gpu_frame, read_host_frame, read_nccl_frame
    from monitor.live.flag_tracker import FlagTracker
    from monitor.logs.canonical_records import parse_file

    steps = parse_file(str(export / "train.jsonl")).steps
    events = read_events(str(export / "events.json"))
    if (run / "train.log").exists():
        end = json.loads((run / "truth.json").read_text()).get("job_end")
        events = merge_events(events, parse_file(str(run / "train.log"), log_end=end).events)
    gpu = read_gpu_frame(export / "gpu.csv")
    host = read_host_frame(export / "host.csv")
    nccl = (read_nccl_frame(export / "nccl.csv") if (export / "nccl.csv").exists()
            else empty_nccl_frame())
    cfg = load_config()
    tracker = FlagTracker()
    seen: dict[tuple, dict[str, Any]] = {}
    ends = sorted(s.end_time for s in steps if s.end_time is not None)
    last = float(gpu["ts"].max()) if len(gpu) else (ends[-1] if ends else 0.0)
    for now in [*(e + 2.0 for e in ends), last]:
        win = [s for s in steps if s.end_time is not None and s.end_time <= now]
        ev = [e for e in events if e.time is None or e.time <= now]
        flags = run_all(win, gpu[gpu["ts"] <= now], host[host["ts"] <= now], ev, config=cfg,
                        now=now, nccl=nccl[nccl["ts"] <= now])
        opened, _closed = tracker.update(flags, now)
        for f in opened:
            seen.setdefault((f.kind, f.scope_label, round(f.start, 1)), f.to_dict())
    return list(seen.values())


def rescore(src: Path) -> list[dict[str, Any]]:
    """Offline analysis of recorded runs again, with this checkout's detectors."""
    records = []
    for truth in sorted(src.rglob("truth.json")):
        run = truth.parent
        t = json.loads(truth.read_text())
        scn = SCENARIOS[t["name"]]
        export = run / "export" if (run / "export").is_dir() else run
        report = analyze(export, run) if (run / "export").is_dir() else {}
        steps = _step_ends(export / "train.jsonl")
        live = _read_json(export / "flags.json", _read_json(run / "flags_live.json", []))
        records.append({"scenario": scn.name, "gpus": t["gpus"], "what": scn.what,
                        "fault_steps": scn.steps, "rc": t.get("rc"),
                        "fault_rank": None if scn.rank is None else scn.rank % t["gpus"],
                        "wall_s": round(t["job_end"] - t["job_start"], 1),
                        "steps_logged": len(steps), "live": score(scn, t["gpus"], live, steps),
                        "replay": score(scn, t["gpus"], replay_live(export, run), steps),
                        "offline": score(scn, t["gpus"], report.get("flags", []), steps),
                        "offline_summary": _summary_bits(report)})
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rescore:
        records = rescore(Path(args.rescore))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        text = table(records)
        (Path(args.out) / "gpu_scenarios_rescored.txt").write_text(text)
        print(text)
        return 0
    if args.make_fixtures:
        make_fixtures(Path(args.make_fixtures[0]), Path(args.make_fixtures[1]))
        return 0
    names = list(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
    gpu_name = "cpu-dry-run"
    if not args.dry_run:
        try:
            import pynvml

            pynvml.nvmlInit()
            gpu_name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            gpu_name = gpu_name.decode() if isinstance(gpu_name, bytes) else gpu_name
        except Exception as exc:  # noqa: BLE001
            print(f"NVML: {exc}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    t_all = time.time()
    for i, name in enumerate(names):
        scn = SCENARIOS[name]
        if scn.min_gpus > args.gpus:
            print(f"skip {name}: needs {scn.min_gpus} GPUs", flush=True)
            continue
        spent = time.time() - t_all
        per = spent / max(1, len(records))
        if records and spent + per > args.budget_s:
            print(f"skip {name}: {spent:.0f} s spent, the next would pass --budget-s", flush=True)
            continue
        t0 = time.time()
        rec = run_one(scn, args.gpus, args, 19100 + 10 * i)
        records.append(rec)
        print(table([rec]).split("\n\n")[0], f"({time.time() - t0:.0f} s)", flush=True)
        write_results(records, args, gpu_name, out)  # after each run: a cut-off call keeps them
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
