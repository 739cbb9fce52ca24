"""Hangs on real GPUs, watched by the real exporter: detected how fast, and is the rank named?

For each scenario the exporter (NVML backend, ``--fr-dir``, ``--hang-pyspy``, shipped ``hang``
settings) follows the log of ``bench/hang_job.py``, whose ranks set the Flight Recorder's
environment (``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``,
``TORCH_FR_DUMP_TEMP_FILE``) as a verl job would in its Ray runtime env. The script reads
``/metrics`` every second and reports, from the arrival of the last step line: when
``verlmon_flag_active{kind="hang"}`` appeared, and which rank ``verlmon_hang_culprit_info``
named. Healthy scenarios (a long validation, a long checkpoint) must raise no hang.

    python3 bench/hang_scenarios.py --out "$OUT"                # on the GPU machine
    python3 bench/hang_scenarios.py --scenarios stop --dry-run --job-python VENV/bin/python
                                                                # here: sim GPUs, gloo on CPU

The job's Python needs torch (the dry-run's: a CPU build, and ``setproctitle``); the script
checks that before it starts and stops with the reason otherwise. In the dry-run the ranks hold
no GPU, so the exporter finds them as it finds a verl job's workers: the Ray prefix they print
into the log and the Ray title they take (``ray::WorkerDict.update_actor``); on GPUs it finds
them as the GPUs' holders. A rank that exits with an error before the case ends fails the case
(``job_rc``, ``job_error``; not in ``kill``, where the peers of the killed rank may fail too).
``kill`` is ok when the dead rank is named (by rank or PID) and none of the ranks left waiting
for it is; ``survivors_waited`` says whether those still ran when it was named (over gloo the
dead rank's forked child keeps its sockets open so that they wait, as NCCL's do).

Writes ``hang_scenarios_<date>_<gpu>.txt``/``.json`` and ``hang_recordings.tar.gz`` (each run's
log, store export, events, flags, dumps) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.exporter import stop_exporter  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One scenario: the job's fault, its world size, and what the monitor should say."""

    name: str
    fault: str
    world: int
    fault_rank: int | None  # the rank to name; None: a healthy run that must stay quiet
    backend: str = "nccl"


#: The process title the dry-run's ranks take (Ray's title of a verl worker in update_actor).
DRY_RUN_TITLE = "ray::WorkerDict.update_actor"

CASES = {c.name: c for c in (
    Case("kernel", "kernel", 1, 0),
    Case("stop", "stop", 2, 1),
    Case("kill", "kill", 2, 1),
    Case("validation", "validation", 2, None),
    Case("checkpoint", "checkpoint", 2, None),
)}


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
            return r.read().decode()
    except OSError:
        return ""


def _culprits(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("verlmon_hang_culprit_info{"):
            out.append(dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line)))
    return out


def run_case(case: Case, args: argparse.Namespace, port: int) -> dict:
    """One scenario end to end; returns its record."""
    run = Path(args.work) / case.name
    shutil.rmtree(run, ignore_errors=True)
    (run / "fr").mkdir(parents=True)
    log = run / "train.log"
    log.touch()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
    exp_cmd = [sys.executable, "-m", "monitor", "exporter", "--listen-address",
               f"127.0.0.1:{port}", "--interval", str(args.interval), "--log", str(log),
               "--store", str(run / "store.db"), "--fr-dir", str(run / "fr"), "--hang-pyspy",
               "--detect-interval", str(args.detect_interval), "--node", "gpu-node"]
    if args.dry_run:
        exp_cmd += ["--gpu-backend", "sim", "--scenario", "healthy"]
    exp_log = open(run / "exporter.log", "w")  # noqa: SIM115
    exporter = subprocess.Popen(exp_cmd, env=env, stdout=exp_log, stderr=subprocess.STDOUT)
    time.sleep(3.0)
    backend = case.backend
    ngpu = 0 if args.dry_run else _gpu_count()
    if args.dry_run or (case.world > max(ngpu, 1) and backend == "nccl"):
        backend = "gloo"  # NCCL refuses two ranks on one GPU
    job_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port + 100),
                   WORLD_SIZE=str(case.world), TORCH_FR_BUFFER_SIZE="2000",
                   TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
                   TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(run / "fr" / "pipe_"),
                   TORCH_FR_DUMP_TEMP_FILE=str(run / "fr" / "fr_"),
                   TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(run / "fr" / "fr_"))
    job_cmd = [args.job_python, str(ROOT / "bench" / "hang_job.py"), "--fault", case.fault,
               "--fault-rank", str(case.fault_rank or 0), "--fault-step", str(args.fault_step),
               "--steps", str(args.steps), "--step-s", str(args.step_s), "--long-s",
               str(args.long_s), "--backend", backend]
    if args.dry_run:  # no GPU to hold: found by their Ray prefix and title, as verl's workers
        job_cmd += ["--title", DRY_RUN_TITLE]
    ranks = []
    with open(log, "a") as out, open(run / "job_stderr.log", "w") as err:
        for r in range(case.world):
            ranks.append(subprocess.Popen(job_cmd, env=dict(job_env, RANK=str(r)), stdout=out,
                                          stderr=err, start_new_session=True))
    t_start = time.time()
    last_size, last_line_at = 0, None
    flag_at, named, named_at, seen = None, [], None, []
    waited: bool | None = None  # kill: the other ranks still ran when the rank was named
    deadline = t_start + args.case_timeout
    while time.time() < deadline:
        size = log.stat().st_size
        if size != last_size:
            last_size, last_line_at = size, time.time()
        text = _get(f"http://127.0.0.1:{port}/metrics")
        if flag_at is None and re.search(r'^verlmon_flag_active\{[^}]*kind="hang"[^}]*\} 1',
                                         text, re.M):
            flag_at = time.time()
        who = _culprits(text)
        if who and named_at is None:
            named, named_at = who, time.time()
            waited = all(p.poll() is None for i, p in enumerate(ranks) if i != case.fault_rank)
        seen = sorted(set(seen) | set(re.findall(
            r'^verlmon_flag_active\{[^}]*kind="(\w+)"[^}]*severity="(?:warning|critical)"'
            r'[^}]*\} 1', text, re.M)))
        rcs = [p.poll() for p in ranks]
        jobs_done = all(rc is not None for rc in rcs)
        if jobs_done and (case.fault_rank is None or flag_at):
            break
        if case.fault_rank is not None and flag_at and named_at and time.time() > named_at + 5:
            break
        time.sleep(1.0)
    job_rc = [p.poll() for p in ranks]  # None: still running (killed now)
    for p in ranks:  # each rank leads its own group: with it, what it forked (kill's holder)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()
    stop_exporter(exporter)
    exp_log.close()
    subprocess.run([sys.executable, "-m", "monitor", "export", str(run / "store.db"), "--out",
                    str(run / "export")], env=env, capture_output=True, timeout=120, check=False)
    rec = {"scenario": case.name, "world": case.world, "backend": backend,
           "expect_rank": case.fault_rank, "hang_flag": flag_at is not None,
           "detect_s": round(flag_at - last_line_at, 1) if flag_at and last_line_at else None,
           "named_s": round(named_at - last_line_at, 1) if named_at and last_line_at else None,
           "named": [{k: c.get(k, "") for k in ("rank", "pid", "gpu", "collective", "seq",
                                                 "frame")} for c in named],
           "flags_seen": seen}
    if case.fault_rank is None:
        rec["ok"] = flag_at is None
    else:
        rec["ok"] = bool(flag_at) and named_rank_ok(named, case.fault_rank,
                                                    [p.pid for p in ranks], case.fault == "kill")
    if case.fault == "kill":
        rec["survivors_waited"] = waited
    # a rank that failed by itself (no torch, no device): what the monitor saw says nothing.
    # With ``kill`` the killed rank's peers may fail too (gloo: the connection closed)
    failed = case.fault != "kill" and any(rc not in (None, 0) for rc in job_rc)
    if failed:
        rec["ok"] = False
        rec["job_error"] = _last_line(run / "job_stderr.log")
    rec["job_rc"] = job_rc
    rec["rank_pids"] = [p.pid for p in ranks]
    (run / "record.json").write_text(json.dumps(rec, indent=1))
    return rec


def named_rank_ok(named: list[dict[str, str]], fault_rank: int, pids: list[int],
                  only: bool = False) -> bool:
    """Whether the culprits ``named`` (labels of ``verlmon_hang_culprit_info``) include the
    faulty rank, by its rank or its PID; with ``only`` (``kill``: the dead rank must be named,
    not the ranks left waiting for it), whether they name no other rank."""
    def rank_of(c: dict[str, str]) -> int | None:
        if c.get("rank", "").isdigit() and int(c["rank"]) < len(pids):
            return int(c["rank"])
        pid = c.get("pid", "")
        return pids.index(int(pid)) if pid.isdigit() and int(pid) in pids else None

    got = {rank_of(c) for c in named}
    return fault_rank in got and (not only or got <= {fault_rank, None})


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def check_job_python(python: str, dry_run: bool) -> str | None:
    """Why the job's Python cannot run ``bench/hang_job.py`` here (None when it can)."""
    mods = "torch, setproctitle" if dry_run else "torch"
    try:
        r = subprocess.run([python, "-c", f"import {mods}"], capture_output=True, text=True,
                           timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    if r.returncode:
        err = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return (f"{python} cannot import {mods} ({err}): give --job-python a Python that has "
                "them (here: a venv with pip install torch==2.13.0 setproctitle)")
    return None


def _gpu_count() -> int:
    """GPUs on this machine, without opening one here (a process holding a GPU would be one
    more candidate for py-spy)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", default=",".join(CASES))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--step-s", type=float, default=4.0)
    p.add_argument("--fault-step", type=int, default=5)
    p.add_argument("--long-s", type=float, default=75.0)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--detect-interval", type=float, default=30.0,
                   help="the exporter's detector interval (30 s is the shipped default)")
    p.add_argument("--case-timeout", type=float, default=150.0)
    p.add_argument("--work", default="/tmp/hang_scenarios")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results"))
    p.add_argument("--job-python", default=sys.executable)
    p.add_argument("--dry-run", action="store_true", help="sim GPU backend, gloo (no GPU)")
    args = p.parse_args(argv)
    why = check_job_python(args.job_python, args.dry_run)
    if why:
        print(f"hang_scenarios: {why}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for i, name in enumerate(args.scenarios.split(",")):
        rec = run_case(CASES[name], args, 19500 + i)
        print(json.dumps(rec), flush=True)
        records.append(rec)
    gpu = "dry-run" if args.dry_run else "H200"
    stem = f"hang_scenarios_{dt.date.today()}_{gpu}"
    (out / f"{stem}.json").write_text(json.dumps(records, indent=1))
    lines = [f"{r['scenario']:<11} world={r['world']} {r['backend']:<5} ok={r['ok']} "
             f"hang={r['hang_flag']} detect_s={r['detect_s']} named_s={r['named_s']} "
             f"named={[c['rank'] + '/' + c['pid'] for c in r['named']]} "
             f"expect={r['expect_rank']} pids={r['rank_pids']} flags={r['flags_seen']}"
             + (f" survivors_waited={r['survivors_waited']}" if "survivors_waited" in r else "")
             + (f" job_error={r['job_error']!r}" if r.get("job_error") else "")
             for r in records]
    (out / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    with tarfile.open(out / "hang_recordings.tar.gz", "w:gz") as tar:
        for name in args.scenarios.split(","):
            run = Path(args.work) / name
            for f in ("train.log", "record.json", "exporter.log", "job_stderr.log"):
                if (run / f).exists():
                    tar.add(run / f, arcname=f"{name}/{f}")
            for sub in ("export", "fr"):
                d = run / sub
                if d.is_dir():
                    for f in sorted(d.iterdir()):
                        if f.is_file() and f.stat().st_size < 8 << 20:
                            tar.add(f, arcname=f"{name}/{sub}/{f.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
