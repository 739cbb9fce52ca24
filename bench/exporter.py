"""Exporter figures on this machine (sim backend by default): scrape latency and CPU overhead.

Three measurements, each a real ``python -m monitor exporter`` subprocess:

1. **scrape latency**: p50/p99 of ``/metrics`` round trips (gzip, as Prometheus asks) for 8 and
   for 64 simulated GPUs, ``--scrapes`` back-to-back requests after a warm-up.
2. **sampling overhead**: the exporter with only the GPU collector (detectors parked) next to a
   bare loop calling the same backend's ``sample()`` at the same interval, both running
   ``--seconds`` at once (same machine load), at 1 s and 0.1 s. CPU % = process CPU time over
   wall time; the ratio exporter / bare loop is the price of everything around the backend
   calls (threads, rows, window, exposition bookkeeping).
3. **full exporter**: every collector plus the detector loop at 1 s, same measure.

Prints a table and writes JSON to ``--out`` (default ``bench/results/exporter_<date>.json``).

``--rollout`` measures the rollout-engine collector: 64 simulated vLLM servers (real /metrics
text, ~39 KB each) on 127.0.0.1 in a process of their own, and two exporters started at once
on simulated GPUs with a run store, one of them also scraping the 64 servers every 5 s
(``--rollout-server`` x64), twice: with the detector loop parked in both (the scraping alone)
and running (the detectors also judge the rollout rows). It reports each exporter's CPU % of a
core, their difference, and the GPU sampling jitter of each (the gaps between a GPU's
consecutive stored samples, against the interval), and writes a text report
(``--rollout-out``).

``--exposition`` measures only the /metrics text, in this process: our writer
(``exporters.exposition.format_families`` behind ``Exposition.render``) against
prometheus-client's ``generate_latest`` over the same collectors (the real gpu, host and flags
collectors on 8 and 64 simulated GPUs), interleaved in the same run, as ratios; and writes a
text report (``--exposition-out``).

    .venv/bin/python bench/exporter.py                  # ~2 minutes here
    python3 bench/exporter.py --backend nvml --gpus 0   # on a GPU node (all its GPUs)
    .venv/bin/python bench/exporter.py --exposition     # ~20 s
    .venv/bin/python bench/exporter.py --rollout --seconds 90   # ~4 minutes
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BARE_LOOP = """
import sys, threading, time
sys.path.insert(0, {root!r})
from exporters.gpu import make_backend
from exporters.options import ExporterOptions
opts = ExporterOptions(scenario="healthy", sim_gpus={gpus}, seed=0)
backend = make_backend({backend!r}, opts)
interval, seconds = {interval}, {seconds}
stop = threading.Event()
backend.sample()
print("ready", flush=True)
c0, w0 = time.process_time(), time.monotonic()
next_at = time.monotonic() + interval
n = 0
while time.monotonic() - w0 < seconds:
    stop.wait(max(0.0, next_at - time.monotonic()))
    backend.sample()
    n += 1
    next_at += interval
print(time.process_time() - c0, time.monotonic() - w0, n, flush=True)
backend.close()
"""


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of a process's live threads, in nanoseconds resolution (schedstat).

    /proc/PID/stat counts in clock ticks (10 ms): far too coarse for a process using 0.1% of
    a core; each thread's /proc/PID/task/TID/schedstat gives its on-CPU time in ns.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e9


def start_exporter(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``python -m monitor exporter``; return it and its /metrics URL."""
    cmd = [sys.executable, "-m", "monitor", "exporter", "--listen-address", "127.0.0.1:0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, **(env or {}),
                                           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    found = re.search(r"serving (http\S+/metrics)", line)
    if not found:
        proc.kill()
        raise SystemExit(f"exporter did not start: {line}{proc.stderr.read()}")
    return proc, found.group(1)


def stop_exporter(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the exporter has not exited 30 s later."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def scrape_latency(backend: str, gpus: int, scrapes: int) -> dict:
    """p50/p99 (ms) of /metrics round trips, and the exposition size."""
    proc, url = start_exporter(["--gpu-backend", backend, "--sim-gpus", str(gpus),
                                "--interval", "1"])
    try:
        time.sleep(2.5)  # a couple of samples in, CPU deltas known
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        for _ in range(10):
            urllib.request.urlopen(req, timeout=10).read()
        times = []
        body = urllib.request.urlopen(url, timeout=10).read()
        size = len(body)
        gpus = gpus or len(re.findall(rb"^verlmon_gpu_up\{", body, re.M))
        for _ in range(scrapes):
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        stop_exporter(proc)
    times.sort()
    return {"gpus": gpus, "scrapes": scrapes, "p50_ms": statistics.median(times),
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
            "max_ms": times[-1], "bytes": size}


def overhead(backend: str, gpus: int, interval: float, seconds: float, full: bool) -> dict:
    """Exporter CPU % beside a bare backend loop's CPU %, both running at once."""
    bare = subprocess.Popen(
        [sys.executable, "-c", BARE_LOOP.format(root=str(ROOT), gpus=gpus, backend=backend,
                                                interval=interval, seconds=seconds)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if full:
        args = ["--gpu-backend", backend, "--sim-gpus", str(gpus), "--interval", str(interval)]
    else:
        args = ["--gpu-backend", backend, "--sim-gpus", str(gpus), "--interval", str(interval),
                "--no-collector.host", "--no-collector.verl_log", "--no-collector.nccl",
                "--no-collector.flags", "--detect-interval", "100000"]
    proc, _url = start_exporter(args)
    try:
        assert bare.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # past startup (imports, first samples)
        c0, w0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, w1 = _cpu_seconds(proc.pid), time.monotonic()
    finally:
        stop_exporter(proc)
    bare_cpu, bare_wall, samples = (float(x) for x in bare.stdout.readline().split())
    bare.wait(timeout=30)
    exp_pct = 100 * (c1 - c0) / (w1 - w0)
    bare_pct = 100 * bare_cpu / bare_wall
    return {"gpus": gpus, "interval_s": interval, "full": full, "seconds": seconds,
            "exporter_cpu_pct": exp_pct, "bare_loop_cpu_pct": bare_pct,
            "bare_samples": int(samples),
            "ratio": exp_pct / bare_pct if bare_pct > 0 else float("inf")}


#: The render budget per scrape (ms of CPU at 64 GPUs): what prometheus-client must stay
#: within for /metrics to switch to it. 10 ms per scrape is 0.07% of a core at Prometheus's
#: default 15 s scrape interval and 1% at a 1 s one.
RENDER_BUDGET_MS = 10.0


def _exposition_for(gpus: int):
    """An Exposition over the real gpu (simulated GPUs), host and flags collectors, sampled."""
    from exporters.collectors.gpu import GpuCollector
    from exporters.collectors.host import HostCollector
    from exporters.exposition import Exposition
    from exporters.gpu.sim import SimBackend
    from exporters.options import ExporterOptions
    from exporters.registry import ExporterContext
    from monitor.live import ViewContext
    from monitor.live.flag_series import FlagsCollector
    from monitor.live.flag_tracker import FlagTracker
    from monitor.live.live_monitor import Recorder
    from monitor.live.rolling_window import RollingWindow

    window = RollingWindow()
    ctx = ExporterContext(node="bench", interval=1.0, sink=Recorder(window),
                          options=ExporterOptions(dcgm_compat=False))
    views = ViewContext(node="bench", interval=1.0, window=window, tracker=FlagTracker())
    gpu = GpuCollector(ctx, backend=SimBackend("healthy", gpus_per_node=gpus, seed=0))
    host = HostCollector(ctx)
    for col in (gpu, host):
        col.sample_once()
        col.sample_once()
    return Exposition({"gpu": gpu, "host": host, "flags": FlagsCollector(views)}, node="bench",
                      version="bench", backend="sim")


def _best_ms(fn, reps: int) -> float:
    """The fastest of ``reps`` calls of ``fn``, ms (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best


def exposition_figures(gpus: int, rounds: int = 7, reps: int = 30) -> dict:
    """Our writer against prometheus-client over the same families, interleaved rounds."""
    import gzip

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_om

    from exporters.exposition import EOF, LabelWriter, _Families, format_families

    expo = _exposition_for(gpus)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(expo)
    families = list(expo.collect())
    fixed = _Families(families)
    labels = LabelWriter()  # warm across calls, as an Exposition's own writer is
    ours, ours_om = (partial(format_families, families, om, labels) for om in (False, True))
    ours_bytes, prom_bytes = ours(), generate_latest(fixed)
    runs: dict[str, list[float]] = {k: [] for k in (
        "ours_writer", "prom_writer", "ours_om_writer", "om_writer", "ours_render",
        "prom_render", "ours_om_render", "gzip")}
    for _ in range(rounds):  # interleaved: the same machine load for both
        runs["ours_writer"].append(_best_ms(ours, reps))
        runs["prom_writer"].append(_best_ms(lambda: generate_latest(fixed), reps))
        runs["ours_om_writer"].append(_best_ms(ours_om, reps))
        runs["om_writer"].append(_best_ms(lambda: generate_om(fixed), reps))
        runs["ours_render"].append(_best_ms(expo.render, reps))
        runs["prom_render"].append(_best_ms(lambda: generate_latest(registry), reps))
        runs["ours_om_render"].append(_best_ms(lambda: expo.render(None, True), reps))
        runs["gzip"].append(_best_ms(lambda: gzip.compress(ours_bytes, 6), reps))
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"gpus": gpus, "samples": sum(len(f.samples) for f in families),
            "bytes": len(ours_bytes), "same_bytes": ours_bytes == prom_bytes,
            **{f"{k}_ms": v for k, v in med.items()},
            "writer_ratio": med["prom_writer"] / med["ours_writer"],
            "render_ratio": med["prom_render"] / med["ours_render"],
            "om_ratio": med["om_writer"] / med["ours_om_writer"],
            "same_om_bytes": format_families(families, True) + EOF == generate_om(fixed)}


def exposition_report(rows: list[dict]) -> str:
    """The text report of :func:`exposition_figures` rows, with the verdict on the budget."""
    lines = [
        f"exposition: our writer vs prometheus-client generate_latest, same run "
        f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')})",
        "collectors: gpu (simulated healthy GPUs), host, flags, plus the exposition's health;",
        "medians of 7 interleaved rounds, each the fastest of 30 calls; ms per scrape",
        "",
        f"{'GPUs':>5} {'samples':>8} {'bytes':>7} {'same':>5} | {'0.0.4: ours':>11} "
        f"{'prom':>7} {'ratio':>6} | {'OM: ours':>8} {'prom':>7} {'ratio':>6} | "
        f"{'render: ours':>12} {'prom':>7} {'ratio':>6} {'ours OM':>8} | {'gzip':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['gpus']:>5} {r['samples']:>8} {r['bytes']:>7} "
            f"{str(r['same_bytes'] and r['same_om_bytes']):>5} | "
            f"{r['ours_writer_ms']:>11.2f} {r['prom_writer_ms']:>7.2f} "
            f"{r['writer_ratio']:>5.2f}x | {r['ours_om_writer_ms']:>8.2f} "
            f"{r['om_writer_ms']:>7.2f} {r['om_ratio']:>5.2f}x | "
            f"{r['ours_render_ms']:>12.2f} {r['prom_render_ms']:>7.2f} "
            f"{r['render_ratio']:>5.2f}x {r['ours_om_render_ms']:>8.2f} | {r['gzip_ms']:>6.2f}")
    big = max(rows, key=lambda r: r["gpus"])
    within = big["prom_render_ms"] <= RENDER_BUDGET_MS
    lines += [
        "",
        "0.0.4 / OM: the text format 0.0.4 / OpenMetrics text from ready families; render: the",
        "whole 0.0.4 scrape (every collect() and the text; ours OM: the same in OpenMetrics,",
        "what Prometheus asks for first); ratio: prometheus-client's time",
        "over ours (above 1: ours is faster); same: identical bytes in both formats;",
        "gzip: compressing our 0.0.4 text (level 6; the server uses level 1).",
        f"budget: {RENDER_BUDGET_MS:g} ms per scrape at {big['gpus']} GPUs; ours renders in "
        f"{big['ours_render_ms']:.2f} ms, prometheus-client in {big['prom_render_ms']:.2f} ms "
        f"({big['render_ratio']:.2f}x): prometheus-client is "
        + ("within it" if within else "over it"),
    ]
    return "\n".join(lines) + "\n"


ENGINE_FLEET = """
import sys, threading
sys.path.insert(0, {root!r})
from monitor.sim.engine_server import EngineServer, EngineState
servers = [EngineServer("vllm", state=EngineState(kv_cache_usage=0.7, running=48)).start()
           for _ in range({count})]
print(" ".join(s.url for s in servers), flush=True)
stop = threading.Event()
while not stop.wait(1.0):
    for s in servers:
        s.advance()
"""


def _gpu_jitter(store_path: Path, interval: float) -> dict:
    """Gaps between each GPU's consecutive samples in the store, against ``interval``."""
    import sqlite3

    with sqlite3.connect(store_path) as conn:
        rows = conn.execute("SELECT gpu, ts FROM gpu_samples ORDER BY gpu, ts").fetchall()
    gaps: list[float] = []
    last: dict[int, float] = {}
    for gpu, ts in rows:
        if gpu in last:
            gaps.append(ts - last[gpu])
        last[gpu] = ts
    dev = sorted(abs(g - interval) * 1000 for g in gaps)
    if not dev:
        return {"samples": 0}
    return {"samples": len(gaps), "jitter_p50_ms": statistics.median(dev),
            "jitter_p99_ms": dev[min(len(dev) - 1, int(len(dev) * 0.99))],
            "jitter_max_ms": dev[-1], "max_gap_s": max(gaps)}


def rollout_figures(servers: int, gpus: int, seconds: float, interval: float,
                    rollout_interval: float, workdir: Path, detectors: bool = True) -> dict:
    """CPU and GPU sampling jitter of an exporter scraping ``servers`` engines, beside one
    that does not, both running at once (``detectors`` False: both with the detector loop
    parked, which leaves the scraping alone)."""
    fleet = subprocess.Popen([sys.executable, "-c", ENGINE_FLEET.format(root=str(ROOT),
                                                                       count=servers)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    urls = fleet.stdout.readline().split()
    assert len(urls) == servers, "the engine fleet did not start"
    common = ["--gpu-backend", "sim", "--sim-gpus", str(gpus), "--interval", str(interval),
              "--no-collector.verl_log", "--no-collector.nccl"]
    if not detectors:
        common += ["--detect-interval", "100000"]
    workdir.mkdir(parents=True, exist_ok=True)
    stores = {name: workdir / f"{name}.db" for name in ("without", "with")}
    for path in stores.values():
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    procs = {}
    try:
        procs["without"], _ = start_exporter([*common, "--store", str(stores["without"])])
        with_args = [*common, "--store", str(stores["with"]),
                     "--rollout-interval", str(rollout_interval)]
        for url in urls:
            with_args += ["--rollout-server", url]
        procs["with"], url_with = start_exporter(with_args)
        time.sleep(max(2.0, rollout_interval + 1.0))  # past startup and the first scrapes
        c0 = {k: _cpu_seconds(p.pid) for k, p in procs.items()}
        w0 = time.monotonic()
        time.sleep(seconds)
        c1 = {k: _cpu_seconds(p.pid) for k, p in procs.items()}
        wall = time.monotonic() - w0
        body = urllib.request.urlopen(url_with, timeout=10).read().decode()
    finally:
        for p in procs.values():
            stop_exporter(p)
        fleet.stdin.close()
        fleet.terminate()
        fleet.wait(timeout=30)
    up = len(re.findall(r'^verlmon_rollout_server_up\{[^}]*\} 1\.0$', body, re.M))
    cpu = {k: 100 * (c1[k] - c0[k]) / wall for k in procs}
    return {"servers": servers, "servers_up": up, "gpus": gpus, "interval_s": interval,
            "detectors": detectors,
            "rollout_interval_s": rollout_interval, "seconds": wall,
            "cpu_pct_without": cpu["without"], "cpu_pct_with": cpu["with"],
            "collector_cpu_pct": cpu["with"] - cpu["without"],
            "jitter_without": _gpu_jitter(stores["without"], interval),
            "jitter_with": _gpu_jitter(stores["with"], interval)}


def rollout_report(runs: list[dict]) -> str:
    """The text report of ``--rollout`` (one block per run)."""
    first = runs[0]
    lines = [
        f"rollout-engine collector ({os.cpu_count()} CPUs, "
        f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')})",
        f"{first['servers']} simulated vLLM servers (real /metrics text, ~39 KB each) on "
        f"127.0.0.1, scraped every {first['rollout_interval_s']:g} s; {first['gpus']} simulated "
        f"GPUs sampled every {first['interval_s']:g} s; run store on; two exporters at once, "
        "one without and one with the servers; GPU jitter = |gap between a GPU's consecutive "
        "stored samples - interval|",
    ]
    for r in runs:
        jw, jo = r["jitter_with"], r["jitter_without"]
        what = ("detector loop on (every 30 s, also over the rollout rows)" if r["detectors"]
                else "detector loop parked in both: the scraping alone")
        lines += [
            "",
            f"{what}; {r['seconds']:.0f} s; {r['servers_up']} servers up at the end",
            f"{'':26} {'CPU % of a core':>16} {'GPU jitter p50 ms':>18} {'p99 ms':>8} "
            f"{'max ms':>8} {'max gap s':>10}",
            f"{'exporter without':26} {r['cpu_pct_without']:>16.2f} "
            f"{jo['jitter_p50_ms']:>18.2f} {jo['jitter_p99_ms']:>8.2f} "
            f"{jo['jitter_max_ms']:>8.2f} {jo['max_gap_s']:>10.3f}",
            f"{'exporter with the servers':26} {r['cpu_pct_with']:>16.2f} "
            f"{jw['jitter_p50_ms']:>18.2f} {jw['jitter_p99_ms']:>8.2f} "
            f"{jw['jitter_max_ms']:>8.2f} {jw['max_gap_s']:>10.3f}",
            f"cost: {r['collector_cpu_pct']:.2f}% of a core (with - without); GPU jitter p99 "
            f"with/without: {jw['jitter_p99_ms'] / max(jo['jitter_p99_ms'], 1e-9):.2f}x",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the measurements, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="sim", choices=("sim", "nvml"))
    p.add_argument("--gpus", default="8,64", help="simulated GPU counts for the latency runs")
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--seconds", type=float, default=15.0, help="length of each CPU run")
    p.add_argument("--out", help="JSON file (default bench/results/exporter_<date>.json)")
    p.add_argument("--exposition", action="store_true",
                   help="only the exposition figures: our writer vs prometheus-client")
    p.add_argument("--exposition-out", help="text report of --exposition (default "
                   "bench/results/exporter_<date>_<host>_exposition.txt)")
    p.add_argument("--host-name", default="devbox", help="machine name in the report's name")
    p.add_argument("--rollout", action="store_true",
                   help="only the rollout-engine collector: 64 simulated servers every 5 s")
    p.add_argument("--rollout-servers", type=int, default=64)
    p.add_argument("--rollout-out", help="text report of --rollout (default bench/results/"
                   "rollout_collector_<date>_<host>.txt)")
    args = p.parse_args(argv)
    if args.rollout:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="verlmon-rollout-bench-") as tmp:
            runs = [rollout_figures(args.rollout_servers, 8, args.seconds, 1.0, 5.0,
                                    Path(tmp) / name, detectors=detectors)
                    for name, detectors in (("scrape", False), ("full", True))]
        text = rollout_report(runs)
        print(text, end="")
        out = Path(args.rollout_out) if args.rollout_out else ROOT / "bench" / "results" / \
            f"rollout_collector_{dt.date.today().isoformat()}_{args.host_name}.txt"
        out.write_text(text)
        print(f"written {out}")
        return 0
    if args.exposition:
        rows = [exposition_figures(int(g)) for g in args.gpus.split(",") if g]
        text = exposition_report(rows)
        print(text, end="")
        out = Path(args.exposition_out) if args.exposition_out else ROOT / "bench" / \
            "results" / f"exporter_{dt.date.today().isoformat()}_{args.host_name}_exposition.txt"
        out.write_text(text)
        print(f"written {out}")
        return 0
    counts = [int(g) for g in args.gpus.split(",") if g]
    if args.backend == "nvml":
        counts = [0]  # the node's real GPUs, however many
    results = {"backend": args.backend, "host_cpus": os.cpu_count(),
               "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "latency": [], "overhead": []}
    for gpus in counts:
        results["latency"].append(scrape_latency(args.backend, gpus, args.scrapes))
    first = counts[0] if counts else 8
    for interval, full in ((1.0, False), (0.1, False), (1.0, True)):
        results["overhead"].append(overhead(args.backend, first, interval, args.seconds, full))

    print(f"\nexporter figures ({args.backend} backend, {os.cpu_count()} CPUs)")
    print("\nscrape latency (gzip, back-to-back)")
    print(f"{'GPUs':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'bytes':>8}")
    for r in results["latency"]:
        print(f"{r['gpus']:>5} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f} "
              f"{r['bytes']:>8}")
    print("\nCPU, % of one core (process CPU time / wall time)")
    print(f"{'GPUs':>5} {'interval':>9} {'exporter':>15} {'exporter %':>11} {'bare loop %':>12} "
          f"{'ratio':>6}")
    for r in results["overhead"]:
        what = "all + detectors" if r["full"] else "gpu only"
        gpus = r["gpus"] or "all"
        print(f"{gpus:>5} {r['interval_s']:>8g}s {what:>15} {r['exporter_cpu_pct']:>11.2f} "
              f"{r['bare_loop_cpu_pct']:>12.2f} {r['ratio']:>6.2f}")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / \
        f"exporter_{dt.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
