"""Run-store figures: GPU-sample insert rate (batches of 8 and 64 rows, one transaction each),
read time of 8 GPUs x 6 h at 1 s, and file size before/after compaction.

    .venv/bin/python bench/store.py [--hours 6] [--gpus 8] [--dir DIR]

Prints one line per figure. Timings depend on the disk and on what else runs; the ratios
between lines of one run are what to compare.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=6.0, help="hours of samples to read back")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs sampled once a second")
    ap.add_argument("--rows", type=int, default=40_000, help="rows per insert-rate run")
    ap.add_argument("--dir", default=None, help="folder for the store files (default: a temp dir)")
    args = ap.parse_args()
    rng = random.Random(0)
    base = Path(args.dir or tempfile.mkdtemp(prefix="verlmon-bench-"))
    base.mkdir(parents=True, exist_ok=True)

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
