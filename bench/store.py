"""Run-store figures: GPU-sample insert rate (batches of 8 and 64 rows, one transaction each),
read time of 8 GPUs x 6 h at 1 s, and file size before/after compaction.

    .venv/bin/python bench/store.py [--hours 6] [--gpus 8] [--dir DIR]
    .venv/bin/python bench/store.py --export [--export-gib 0.25,1,2] [--whole-gib 0.25]

Prints one line per figure. Timings depend on the disk and on what else runs; the ratios
between lines of one run are what to compare.

``--export``: peak memory of ``verl-monitor export`` against the store's size. A store of
8 GPUs sampled every second (plus host samples and a step every 30 s with 80 metrics) is grown
to each size in ``--export-gib`` (the samples made inside SQLite, so building 2 GiB takes a
minute or two), and each export runs in a child process that reports its own peak RSS
(``ru_maxrss``). Beside it: the child's RSS doing nothing but the imports, and, for the sizes
up to ``--whole-gib``, the export as it was before it streamed (every table read whole).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS
from monitor.records import StepRecord
from monitor.store import RunStore


def gpu_rows(t0: float, seconds: int, gpus: int, rng: random.Random) -> list[dict]:
    """Realistic-looking GPU samples: one per GPU per second."""
    rows = []
    for i in range(seconds):
        for g in range(gpus):
            util = rng.uniform(60, 100)
            rows.append({
                "ts": t0 + i, "node": "node0", "gpu": g, "util": round(util, 2),
                "sm_active": round(util * 0.8, 2), "mem_used_bytes": 7.0e10 + rng.random() * 1e9,
                "mem_total_bytes": 1.5e11, "power_w": round(rng.uniform(300, 700), 2),
                "tensor_active": round(util * 0.5, 2), "dram_active": round(util * 0.3, 2),
            })
    return rows


def insert_rate(path: Path, batch: int, total: int, rng: random.Random) -> float:
    """Rows per second inserting ``total`` rows in transactions of ``batch`` rows."""
    store = RunStore(path)
    rows = gpu_rows(0.0, total // 8 + 1, 8, rng)[:total]
    start = time.perf_counter()
    for i in range(0, total, batch):
        store.add_gpu_samples(rows[i:i + batch])
    elapsed = time.perf_counter() - start
    store.close()
    return total / elapsed


#: The child that exports, or reads every table whole as the export did before (``whole``), or
#: only imports (``idle``); it prints its peak RSS (``ru_maxrss``, KiB on Linux) and seconds.
_EXPORT_CHILD = """
import json, resource, sys, time
from monitor.store import RunStore, export_dir
from monitor.frames import write_frame
mode, store, out = sys.argv[1:4]
t = time.perf_counter()
if mode == "stream":
    export_dir(store, out)
elif mode == "whole":
    with RunStore(store, create=False) as s:
        gpu, host, steps = s.gpu_frame(), s.host_frame(), s.steps()
    write_frame(gpu, out + "/gpu.csv")
    write_frame(host, out + "/host.csv")
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def grow_store(store: RunStore, target_bytes: int, gpus: int, state: dict) -> None:
    """Add samples (made by SQLite itself) and steps until the file holds ``target_bytes``.
    ``state`` carries the next second to write between calls."""
    conn = store._conn()
    batch_s = 20_000  # seconds of samples per INSERT ... SELECT
    num = "abs(random() % 10000) / 100.0"
    gpu_sel = ", ".join(
        "t0 + i" if c == "ts" else "'node0'" if c == "node" else "g" if c == "gpu" else num
        for c in GPU_COLUMNS)
    host_sel = ", ".join("t0 + i" if c == "ts" else "'node0'" if c == "node" else num
                         for c in HOST_COLUMNS)
    rng = random.Random(state["second"])
    while store.file_bytes() < target_bytes:
        t0 = 1_767_225_600.0 + state["second"]
        seconds = f"WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r WHERE i < {batch_s - 1}) "
        with store._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                f"INSERT INTO gpu_samples ({', '.join(GPU_COLUMNS)}) {seconds}, "
                f"g(g) AS (SELECT 0 UNION ALL SELECT g + 1 FROM g WHERE g < {gpus - 1}) "
                f"SELECT {gpu_sel} FROM r, g, (SELECT {t0} AS t0) ORDER BY i, g")
            conn.execute(f"INSERT INTO host_samples ({', '.join(HOST_COLUMNS)}) {seconds}"
                         f"SELECT {host_sel} FROM r, (SELECT {t0} AS t0)")
            conn.execute("COMMIT")
        steps = []
        for k in range(batch_s // 30):
            metrics = {f"actor/metric_{j}": rng.random() for j in range(74)}
            metrics.update({"timing_s/gen": 12.0, "timing_s/old_log_prob": 3.0,
                            "timing_s/update_actor": 9.0, "timing_s/step": 30.0,
                            "perf/throughput": 1234.5, "training/global_step": 0})
            steps.append(StepRecord(step=state["step"] + k, end_time=t0 + 30 * (k + 1),
                                    total=30.0, phases={"gen": 12.0, "old_log_prob": 3.0,
                                                        "update_actor": 9.0},
                                    metrics=metrics))
        store.add_steps(steps)
        state["step"] += len(steps)
        state["second"] += batch_s
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the size is the file's, WAL empty


def export_child(mode: str, store: Path, out: Path) -> dict:
    """Run one export child (``stream``, ``whole`` or ``idle``) and return its figures."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", _EXPORT_CHILD, mode, str(store), str(out)],
                          capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["out_bytes"] = sum(p.stat().st_size for p in out.iterdir())
    shutil.rmtree(out)
    return figures


def export_memory(args: argparse.Namespace, base: Path) -> None:
    """Peak RSS of the export against the store's size (see the module docstring)."""
    sizes = sorted(float(x) for x in args.export_gib.split(","))
    path = base / "export.db"
    path.unlink(missing_ok=True)
    store = RunStore(path, max_bytes=2**62)
    state = {"second": 0, "step": 0}
    idle = export_child("idle", path, base / "out")
    print(f"child doing only the imports: peak RSS {idle['peak_rss_kib'] / 1024:.0f} MiB")
    for gib in sizes:
        start = time.perf_counter()
        grow_store(store, int(gib * 2**30), args.gpus, state)
        size = store.file_bytes()
        counts = store.counts()
        print(f"store {size / 2**30:.2f} GiB ({counts['gpu_samples']:,} GPU + "
              f"{counts['host_samples']:,} host samples, {counts['steps']:,} steps; built in "
              f"{time.perf_counter() - start:.0f} s)")
        got = export_child("stream", path, base / "out")
        print(f"  export (streamed): peak RSS {got['peak_rss_kib'] / 1024:.0f} MiB "
              f"({got['peak_rss_kib'] * 1024 / size:.2f}x the store), {got['seconds']:.1f} s, "
              f"{got['out_bytes'] / 2**30:.2f} GiB written")
        if gib <= args.whole_gib:
            old = export_child("whole", path, base / "out")
            print(f"  before (each table read whole; GPU, host, steps only): peak RSS "
                  f"{old['peak_rss_kib'] / 1024:.0f} MiB ({old['peak_rss_kib'] * 1024 / size:.2f}x "
                  f"the store, {old['peak_rss_kib'] / got['peak_rss_kib']:.1f}x streamed), "
                  f"{old['seconds']:.1f} s")
    store.close()
    path.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=6.0, help="hours of samples to read back")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs sampled once a second")
    ap.add_argument("--rows", type=int, default=40_000, help="rows per insert-rate run")
    ap.add_argument("--dir", default=None, help="folder for the store files (default: a temp dir)")
    ap.add_argument("--export", action="store_true",
                    help="measure the export's peak memory against the store's size instead")
    ap.add_argument("--export-gib", default="0.25,1,2",
                    help="store sizes (GiB, comma-separated) to export (default 0.25,1,2)")
    ap.add_argument("--whole-gib", type=float, default=0.25,
                    help="also run the old whole-read export up to this size (GiB)")
    args = ap.parse_args()
    rng = random.Random(0)
    base = Path(args.dir or tempfile.mkdtemp(prefix="verlmon-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    if args.export:
        export_memory(args, base)
        return

    for batch in (8, 64):
        rate = insert_rate(base / f"insert{batch}.db", batch, args.rows, rng)
        print(f"insert, batches of {batch:>2} rows: {rate:,.0f} rows/s "
              f"({rate / args.gpus:,.0f} samples/s of {args.gpus} GPUs)")

    seconds = int(args.hours * 3600)
    path = base / "read.db"
    store = RunStore(path, retention_s=3600, downsample_s=15)
    t0 = 1_767_225_600.0
    start = time.perf_counter()
    chunk = 600
    for s in range(0, seconds, chunk):
        store.add_gpu_samples(gpu_rows(t0 + s, min(chunk, seconds - s), args.gpus, rng))
    fill = time.perf_counter() - start
    n = seconds * args.gpus
    print(f"fill {n:,} rows ({args.gpus} GPUs x {args.hours:g} h at 1 s) in batches of "
          f"{chunk * args.gpus}: {fill:.2f} s ({n / fill:,.0f} rows/s)")

    store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    start = time.perf_counter()
    df = store.gpu_frame()
    full = time.perf_counter() - start
    assert len(df) == n
    print(f"read all {len(df):,} rows as a DataFrame: {full:.3f} s")
    start = time.perf_counter()
    last = store.gpu_frame(start=t0 + seconds - 900)
    window = time.perf_counter() - start
    print(f"read the last 15 min ({len(last):,} rows): {window * 1000:.1f} ms")
    start = time.perf_counter()
    chart = store.gpu_frame(resample_s=30.0)
    print(f"read all {args.hours:g} h resampled to 30 s in SQLite ({len(chart):,} rows): "
          f"{time.perf_counter() - start:.3f} s")

    before = store.file_bytes()
    start = time.perf_counter()
    result = store.compact()
    took = time.perf_counter() - start
    after = store.file_bytes()
    print(f"file before compaction: {before / 2**20:.1f} MiB ({before / n:.0f} bytes/row)")
    print(f"compact (retention 1 h, 15 s buckets): {took:.2f} s, {result['downsampled']:,} raw "
          f"rows -> {result['buckets']:,} buckets; file after: {after / 2**20:.1f} MiB "
          f"({after / before:.1%} of before)")
    start = time.perf_counter()
    df2 = store.gpu_frame()
    print(f"read after compaction ({len(df2):,} rows): {time.perf_counter() - start:.3f} s")
    store.close()


if __name__ == "__main__":
    main()
