"""Soak test of the node exporter: many simulated GPUs at a fast interval for N minutes.

Starts a real ``python -m monitor exporter`` (sim backend, ``--gpus`` GPUs every ``--interval``
seconds, a run store, the detector loop) and, while it runs, keeps a verl console log growing
(one step line every ``--step-s`` seconds plus tqdm-style noise lines) and an NCCL Inspector
dump directory growing (one AllReduce record per rank and step). Every minute it prints one line
with the exporter's RSS, open file descriptors, threads, CPU (% of one core over that minute),
and one /metrics scrape's size and time, the store's state and the drop counters (the detectors'
window drops GPU rows once its 200,000-row cap is full: about 5 minutes of 64 GPUs every 0.1 s;
every other ``verlmon_*dropped*_total`` should stay 0). At the end it prints the RSS growth over
the last half of the run, the store's row counts and the exporter's exit code after SIGTERM.

It stops by itself after ``--minutes`` (and kills the exporter if SIGTERM does not end it).

    .venv/bin/python bench/soak.py --minutes 60 > bench/results/soak_<date>_<host>.txt
    .venv/bin/python bench/soak.py --minutes 2      # a quick look

``--kill-every MINUTES`` (restart mode, default 60 min with a kill every 5 min): the exporter
is killed with SIGKILL every that many minutes and started again with the same arguments
after ``--down-s`` seconds, while the log keeps growing. Each kill prints one line: steps the
log had, steps stored, steps not yet stored at the kill (written in the last flush interval:
read again after the restart) and the store's duplicate rows. At the end, after SIGTERM: steps
lost for good (target 0) and duplicate steps (target 0), flag rows per flag (target: one row
each) and the saved positions that could not be resumed.

    .venv/bin/python bench/soak.py --kill-every 5 > bench/results/soak_restart_<date>_<host>.txt
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int) -> dict:
    """RSS (MB), open fds, threads and CPU seconds of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    threads = int(fields[17])
    rss = int(fields[21]) * PAGE / 1e6
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mb": rss, "fds": fds, "threads": threads, "cpu_s": cpu}


def step_line(step: int, rng_phase: float) -> str:
    """A verl console step line (0.4-era keys) with a little variation."""
    gen = 30.0 + (step % 7) * 0.5 + rng_phase
    upd = 12.0 + (step % 5) * 0.3
    total = gen + upd + 6.0
    return (f"(main_task pid=4021) step:{step} - timing_s/gen:{gen:.3f} - timing_s/ref:2.000 - "
            f"timing_s/old_log_prob:4.000 - timing_s/update_actor:{upd:.3f} - "
            f"timing_s/step:{total:.3f} - actor/pg_loss:-0.012 - actor/entropy:0.61 - "
            f"perf/throughput:{1000.0 + step % 13:.1f} - response_length/mean:512.0")


def nccl_line(rank: int, seq: int, ts_us: int, comm: str) -> str:
    """An NCCL Inspector coll_perf record of one rank (rank 3 waits the longest)."""
    exec_us = 40_000 + (30_000 if rank == 3 else 0) + rank * 100
    return json.dumps({
        "header": {"id": "0x7f8c496ae9f661", "comm_name": comm, "rank": rank, "n_ranks": 8,
                   "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.2", "dump_timestamp_us": ts_us,
                     "hostname": "soak-node", "pid": 5000 + rank},
        "coll_perf": {"coll": "AllReduce", "coll_sn": seq, "coll_msg_size_bytes": 1 << 30,
                      "coll_exec_time_us": exec_us, "coll_timing_source": "kernel_gpu",
                      "coll_algobw_gbs": 200.0, "coll_busbw_gbs": 350.0},
    })


class Writer(threading.Thread):
    """Appends to the verl log and the NCCL dumps until stopped."""

    def __init__(self, log_path: Path, nccl_dir: Path, step_s: float, noise_per_s: int) -> None:
        super().__init__(name="soak-writer", daemon=True)
        self.log_path, self.nccl_dir = log_path, nccl_dir
        self.step_s, self.noise_per_s = step_s, noise_per_s
        self.stop = threading.Event()
        self.steps = 0
        self.log_bytes = 0

    def run(self) -> None:
        dumps = [open(self.nccl_dir / f"soak-node-pid{5000 + r}.log", "a") for r in range(8)]
        next_step = time.monotonic()
        with open(self.log_path, "a") as log:
            while not self.stop.wait(1.0):
                noise = "".join(f"Training Progress: {self.steps}/100000 [00:01<00:02, "
                                f"{i}.1it/s]\n" for i in range(self.noise_per_s))
                log.write(noise)
                self.log_bytes += len(noise)
                if time.monotonic() >= next_step:
                    next_step += self.step_s
                    self.steps += 1
                    line = step_line(self.steps, 0.0) + "\n"
                    log.write(line)
                    self.log_bytes += len(line)
                    ts_us = int(time.time() * 1e6)
                    for r, fh in enumerate(dumps):
                        for comm in ("DP Group 0", "TP Group 0"):
                            fh.write(nccl_line(r, self.steps, ts_us, comm) + "\n")
                        fh.flush()
                log.flush()
        for fh in dumps:
            fh.close()


def scrape(url: str) -> tuple[int, float]:
    """(bytes, seconds) of one /metrics scrape; (-1, nan) when it fails."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return len(resp.read()), time.perf_counter() - t0
    except OSError:
        return -1, float("nan")


def metric_value(body: str, name: str) -> str:
    found = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", body, re.M)
    return found.group(1) if found else "-"


def rss_growth(rows: list[dict]) -> list[str]:
    """Lines on RSS over the last half of the run: end points, medians of the first and last
    five readings (the heap is trimmed now and then, so single readings swing), and the least-
    squares slope, as % of the half's median per 30 minutes."""
    half = [r for r in rows if r["minute"] >= rows[-1]["minute"] / 2] if rows else []
    if len(half) < 2:
        return ["# too short for an RSS trend"]
    rss = [r["rss_mb"] for r in half]
    mins = [r["minute"] for r in half]
    first, last = rss[0], rss[-1]
    head, tail = sorted(rss[:5])[len(rss[:5]) // 2], sorted(rss[-5:])[len(rss[-5:]) // 2]
    mean_m, mean_r = sum(mins) / len(mins), sum(rss) / len(rss)
    var = sum((m - mean_m) ** 2 for m in mins)
    slope = sum((m - mean_m) * (r - mean_r) for m, r in zip(mins, rss, strict=True))
    slope = slope / var if var else 0.0
    mid = sorted(rss)[len(rss) // 2]
    return [
        f"# RSS over the last half (minute {mins[0]:.1f} -> {mins[-1]:.1f}): {first:.1f} -> "
        f"{last:.1f} MB, {(last - first) / first * 100:+.1f}% end to end",
        f"# median of the first 5 vs last 5 readings of that half: {head:.1f} -> {tail:.1f} MB, "
        f"{(tail - head) / head * 100:+.1f}%",
        f"# least-squares slope over that half: {slope:+.2f} MB/min = "
        f"{slope * 30 / mid * 100:+.1f}% of its median ({mid:.1f} MB) per 30 min",
        f"# peak RSS {max(r['rss_mb'] for r in rows):.1f} MB; mean CPU "
        f"{sum(r.get('cpu_pct', 0.0) for r in rows) / len(rows):.1f}% of a core",
    ]


def summarize(path: str) -> int:
    """Print the RSS lines for an existing soak output (its per-minute table)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and not line.startswith("#") and parts[0][0].isdigit():
            rows.append({"minute": float(parts[0]), "rss_mb": float(parts[1]),
                         "cpu_pct": float(parts[4])})
    print("\n".join(rss_growth(rows)))
    return 0


def start_exporter(cmd: list[str], work: Path, run: int) -> tuple[subprocess.Popen, str | None]:
    """Start the exporter; (process, /metrics URL or None when it did not start)."""
    err = open(work / f"exporter.{run}.stderr", "w")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT),
                                 "PYTHONUNBUFFERED": "1"})
    err.close()
    found = re.search(r"serving (http\S+/metrics)", proc.stdout.readline())
    return proc, found.group(1) if found else None


def store_steps(store: Path) -> tuple[list[int], int]:
    """(step numbers of the console rows, rows of events) read from the store, read-only."""
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
            steps = [r[0] for r in db.execute("SELECT step FROM steps")]
            events = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        return steps, events
    except sqlite3.Error:
        return [], 0


def restart_soak(args: argparse.Namespace, work: Path, cmd: list[str], log_path: Path,
                 nccl_dir: Path, store: Path) -> int:
    """The --kill-every mode: SIGKILL every N minutes, restart, count lost and doubled steps."""
    print(f"# restart mode: SIGKILL every {args.kill_every:g} min, down {args.down_s:g} s each "
          "time, then the same command again", flush=True)
    writer = Writer(log_path, nccl_dir, args.step_s, args.noise_per_s)
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    run, kills = 0, 0
    proc, url = start_exporter(cmd, work, run)
    if url is None:
        print("exporter did not start", flush=True)
        return 1
    writer.start()
    print("minute  kill  written  stored  not_yet_stored  dup_rows  restart_s", flush=True)
    try:
        while True:
            next_kill = min(end, time.monotonic() + args.kill_every * 60)
            while time.monotonic() < next_kill and proc.poll() is None:
                time.sleep(min(1.0, max(0.0, next_kill - time.monotonic())))
            if time.monotonic() >= end or proc.poll() is not None:
                break
            written = writer.steps
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            kills += 1
            steps, _ = store_steps(store)
            stored = len(set(steps))
            time.sleep(args.down_s)
            run += 1
            t_start = time.monotonic()
            proc, url = start_exporter(cmd, work, run)
            took = time.monotonic() - t_start
            print(f"{(time.monotonic() - t0) / 60:6.1f}  {kills:4d}  {written:7d}  {stored:6d}  "
                  f"{written - stored:14d}  {len(steps) - stored:8d}  {took:9.1f}", flush=True)
            if url is None:
                print("# exporter did not start again", flush=True)
                return 1
    finally:
        writer.stop.set()
        writer.join(timeout=10)
        rc = stop_exporter(proc)
    return restart_report(store, writer.steps, kills, rc, url)


def stop_exporter(proc: subprocess.Popen) -> int | str:
    """SIGTERM (SIGKILL after 60 s); the exit code, or how it ended."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "killed after 60 s"


def restart_report(store: Path, written: int, kills: int, rc: object, url: str | None) -> int:
    """The end of the restart mode: lost and doubled steps, events, flags."""
    steps, events = store_steps(store)
    distinct = set(steps)
    lost = sorted(set(range(1, written + 1)) - distinct)
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
        flag_rows = db.execute("SELECT kind, scope_label, COUNT(*), SUM(\"end\" IS NULL) "
                               "FROM flags GROUP BY kind, scope_label").fetchall()
        lost_events = db.execute("SELECT COUNT(*) FROM events WHERE kind = 'truncated' AND "
                                 "data LIKE '%\"lost\"%'").fetchone()[0]
    print(f"# {kills} kills; steps written {written}, stored {len(distinct)} distinct in "
          f"{len(steps)} rows: lost {len(lost)} {lost[:10]}, duplicate rows "
          f"{len(steps) - len(distinct)}", flush=True)
    print(f"# events stored {events}; saved positions whose file was gone (unrecovered) "
          f"{lost_events}", flush=True)
    print("# flag rows (kind, scope, rows, open): "
          + (", ".join(f"{k} [{s}] {n} rows {o} open" for k, s, n, o in flag_rows) or "none"),
          flush=True)
    print(f"# exporter exit code after the final SIGTERM: {rc}", flush=True)
    return 0 if not lost and len(steps) == len(distinct) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--step-s", type=float, default=5.0, help="seconds between step lines")
    ap.add_argument("--noise-per-s", type=int, default=20, help="tqdm lines a second")
    ap.add_argument("--report-s", type=float, default=60.0, help="seconds between lines")
    ap.add_argument("--workdir", help="where the log, dumps and store go (default: a temp dir)")
    ap.add_argument("--kill-every", type=float, metavar="MINUTES",
                    help="restart mode: SIGKILL the exporter every MINUTES (e.g. 5) and start "
                    "it again; reports steps lost and doubled")
    ap.add_argument("--down-s", type=float, default=3.0,
                    help="restart mode: seconds the exporter stays down after each kill")
    ap.add_argument("--summarize", metavar="FILE",
                    help="only print the RSS trend of an earlier run's output and exit")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="verlmon-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    log_path, nccl_dir, store = work / "train.log", work / "nccl", work / "soak.db"
    nccl_dir.mkdir(exist_ok=True)
    log_path.touch()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                         capture_output=True).stdout.strip()
    print(f"# soak: {args.gpus} sim GPUs every {args.interval:g} s, {args.minutes:g} min, "
          f"step every {args.step_s:g} s, {args.noise_per_s} noise lines/s, 8 NCCL ranks x 2 "
          f"comms; commit {git}; started {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S} "
          f"UTC; cores {os.cpu_count()}; work {work}", flush=True)
    cmd = [sys.executable, "-m", "monitor", "exporter", "--listen-address", "127.0.0.1:0",
           "--gpu-backend", "sim", "--scenario", "healthy", "--sim-gpus", str(args.gpus),
           "--interval", str(args.interval), "--log", str(log_path), "--nccl-dir",
           str(nccl_dir), "--store", str(store), "--node", "soak-node"]
    if args.kill_every:
        return restart_soak(args, work, cmd, log_path, nccl_dir, store)
    err = open(work / "exporter.stderr", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT),
                                 "PYTHONUNBUFFERED": "1"})
    writer = Writer(log_path, nccl_dir, args.step_s, args.noise_per_s)
    rows: list[dict] = []
    rc = None
    try:
        line = proc.stdout.readline()
        found = re.search(r"serving (http\S+/metrics)", line)
        if not found:
            print(f"exporter did not start: {line.strip()}", flush=True)
            return 1
        url = found.group(1)
        writer.start()
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        prev = proc_stats(proc.pid)
        prev_t = t0
        print("minute  rss_mb  fds  threads  cpu_%core  scrape_kb  scrape_ms  steps  log_mb  "
              "store_up  win_drop  other_drop", flush=True)
        next_report = t0 + args.report_s
        while True:
            now = time.monotonic()
            if now >= end or proc.poll() is not None:
                break
            time.sleep(max(0.0, min(next_report, end) - now))
            if proc.poll() is not None:
                break
            now = time.monotonic()
            stats = proc_stats(proc.pid)
            cpu = (stats["cpu_s"] - prev["cpu_s"]) / max(1e-9, now - prev_t) * 100
            prev, prev_t = stats, now
            size, took = scrape(url)
            body = ""
            if size > 0:
                with urllib.request.urlopen(url, timeout=30) as resp:
                    body = resp.read().decode()
            window_drop = sum(float(v) for v in re.findall(
                r"^verlmon_window_dropped_rows_total(?:\{[^}]*\})? (\S+)$", body, re.M))
            other_drop = sum(float(v) for v in re.findall(
                r"^verlmon_(?!window)\w*dropped\w*_total(?:\{[^}]*\})? (\S+)$", body, re.M))
            row = {"minute": (now - t0) / 60, **stats, "cpu_pct": cpu}
            rows.append(row)
            print(f"{row['minute']:6.1f}  {stats['rss_mb']:6.1f}  {stats['fds']:3d}  "
                  f"{stats['threads']:7d}  {cpu:9.1f}  {size / 1024:9.1f}  {took * 1000:9.1f}  "
                  f"{writer.steps:5d}  {writer.log_bytes / 1e6:6.1f}  "
                  f"{metric_value(body, 'verlmon_store_up'):>8}  {window_drop:8.0f}  "
                  f"{other_drop:10.0f}", flush=True)
            next_report += args.report_s
        if proc.poll() is not None:
            print(f"# exporter exited early with {proc.returncode}", flush=True)
    finally:
        writer.stop.set()
        rc = stop_exporter(proc)
        err.close()
    print("\n".join(rss_growth(rows)), flush=True)
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                      for t in ("gpu_samples", "steps", "nccl_samples")
                      if db.execute("SELECT 1 FROM sqlite_master WHERE name=?", (t,)).fetchone()}
            check = db.execute("PRAGMA quick_check").fetchone()[0]
        print(f"# store rows {counts}; quick_check {check}; steps written by the log "
              f"{writer.steps}", flush=True)
    except sqlite3.Error as exc:
        print(f"# store not readable: {exc}", flush=True)
    tail = (work / "exporter.stderr").read_text(errors="replace").strip().splitlines()[-5:]
    print(f"# exporter exit code after SIGTERM: {rc}; last stderr lines: {tail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
