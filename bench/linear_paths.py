"""Issue 41 item 5: the three paths round 5 found quadratic (or holding the log) measured at
growing sizes, each against a linear baseline of the same size timed in the same run.

- **merge** (``monitor.logs.merge``): the records of a fully-async log whose rollouter line is
  printed a step late (``T(n), R(n-1)``: every rollouter record a stray joined to its step's
  record two groups back) against the same records printed in turn (``T(n), R(n)``: joined as
  they come, no stray). Timed: ``merge_steps`` alone on the parser's records, and the whole
  ``parse_file`` at the largest size. Also counted: the resume events left (round 5: 4,999
  for 5,000 steps).
- **skipped_updates** (``monitor.detect.skipped_updates``): the detector on n steps with one
  ``grad_not_finite`` warning each and no grad_norm printed, against the same n steps with
  a NaN grad_norm printed and no warning (the same flag from the step lines).
- **sidecar** (``monitor.logs.arrivals``): ``parse_file`` of a log with its ``.arrivals``
  sidecar (a record a chunk), against the same log without one; time and the peak resident
  memory of a child process doing only that parse (round 5: 1.21 GB for a 1 GB log with a
  sidecar, 134 MB without). At each size: step lines only, and each step line followed by
  1 KB of worker output; once more at 1,000 steps with ``--big-log-mb`` MB of worker lines
  (the log's bytes, not its records, then decide what a reader holding the log needs).

Each row prints CPU seconds of the path and the baseline, their ratio, and the microseconds a
step costs; linear means the ratio and the cost a step stay flat as n grows ten-fold. Usage:
``python bench/linear_paths.py [--sizes 10000,100000] [--big-log-mb 256] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.config import load_config  # noqa: E402
from monitor.detect import make_context  # noqa: E402
from monitor.detect.skipped_updates import detect_skipped_updates  # noqa: E402
from monitor.frames import empty_gpu_frame, empty_host_frame  # noqa: E402
from monitor.logs.canonical_records import LogParser, parse_file  # noqa: E402
from monitor.logs.merge import merge_steps  # noqa: E402
from monitor.records import Event, StepRecord  # noqa: E402

TRAINER = "(FullyAsyncTrainer pid=41) "


def trainer_line(n: int) -> str:
    return (TRAINER + f"step:{n} - training/global_step:{n} - timing_s/gen:20.0 - "
            "timing_s/update_actor:30.0 - timing_s/step:56.0")


def rollouter_line(n: int) -> str:
    return (TRAINER + f"step:{n} - fully_async/rollouter/active_time:50.0 - "
            "fully_async/rollouter/version_time:60.0")


def fully_async_lines(n: int, late: bool) -> list[str]:
    """``T(k), R(k-1)`` (late) or ``T(k), R(k)`` (in turn) for k = 1..n."""
    out = []
    for k in range(1, n + 1):
        out.append(trainer_line(k))
        if not late:
            out.append(rollouter_line(k))
        elif k > 1:
            out.append(rollouter_line(k - 1))
    return out


def cpu(fn, *args):
    """(CPU seconds of this process, result)."""
    start = time.process_time()
    result = fn(*args)
    return time.process_time() - start, result


def raw_records(lines: list[str]) -> list[StepRecord]:
    parser = LogParser()
    out = []
    for line in lines:
        out += [i for i in parser.feed(line) if isinstance(i, StepRecord)]
    out += [i for i in parser.flush() if isinstance(i, StepRecord)]
    return out


def bench_merge(n: int) -> dict:
    late, in_turn = raw_records(fully_async_lines(n, True)), raw_records(fully_async_lines(n, False))
    t_late, merged = cpu(merge_steps, late)
    t_turn, merged_turn = cpu(merge_steps, in_turn)
    assert len(merged) == len(merged_turn) == n, (len(merged), len(merged_turn))
    return {"path": "merge_steps", "n": n, "path_s": t_late, "baseline_s": t_turn}


def bench_merge_parse(n: int, folder: Path) -> dict:
    out = {}
    for name, late in (("late", True), ("in_turn", False)):
        log = folder / f"fa_{name}_{n}.log"
        log.write_text("\n".join(fully_async_lines(n, late)) + "\n")
        seconds, parsed = cpu(parse_file, log, 1e9)
        out[name] = (seconds, sum(1 for e in parsed.events if e.kind == "resume"),
                     len(parsed.steps))
        log.unlink()
    return {"path": "parse_file (fully-async, rollouter line a step late)", "n": n,
            "path_s": out["late"][0], "baseline_s": out["in_turn"][0],
            "resumes": out["late"][1], "steps": out["late"][2]}


def steps_for(n: int, nan_printed: bool) -> list[StepRecord]:
    out = []
    for k in range(1, n + 1):
        metrics = {"actor/grad_norm": math.nan} if nan_printed else {}
        out.append(StepRecord(step=k, end_time=1e9 + 30.0 * k, total=30.0,
                              phases={"gen": 15.0, "update_actor": 10.0, "other": 5.0},
                              metrics=metrics))
    return out


def bench_skipped(n: int) -> dict:
    warned = steps_for(n, False)
    warns = [Event("grad_not_finite", None, k - 1 if k > 1 else None,
                   "WARN: rank 0 grad_norm is not finite: nan",
                   {"value": "nan", "rank": 0, "role": "actor", "worker": "WorkerDict",
                    "pid": 1523}) for k in range(1, n + 1)]
    printed = steps_for(n, True)
    config = load_config()
    ctx_w = make_context(warned, empty_gpu_frame(), empty_host_frame(), warns, config)
    ctx_p = make_context(printed, empty_gpu_frame(), empty_host_frame(), [], config)
    t_w, flags_w = cpu(detect_skipped_updates, ctx_w)
    t_p, flags_p = cpu(detect_skipped_updates, ctx_p)
    assert len(flags_w) == len(flags_p) == 1
    return {"path": "skipped_updates (a warning a step)", "n": n, "path_s": t_w,
            "baseline_s": t_p}


#: The child's own peak: VmHWM starts again at exec (ru_maxrss keeps the parent's).
_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from monitor.logs.canonical_records import parse_file
t0 = time.process_time()
parsed = parse_file({log!r})
seconds = time.process_time() - t0
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(seconds, hwm, len(parsed.steps),
      sum(1 for s in parsed.steps if s.time_source == "sidecar"))
"""


#: Bytes of worker output printed after each step line in the sidecar's large-log case.
NOISE = "(WorkerDict pid=9) INFO: " + "x" * 1000 + "\n"


def bench_sidecar(n: int, folder: Path, noise: int = 0) -> dict:
    """parse_file in a child process (its own peak RSS), with and without the sidecar; with
    ``noise``, each step line is followed by that many 1 KB worker lines (the log's bytes,
    not its steps, then dominate a reader that holds the log)."""
    log = folder / f"sc_{n}.log"
    now = time.time()
    offset = 0
    with open(log, "w") as fh, open(str(log) + ".arrivals", "w") as sc:
        for k in range(1, n + 1):
            line = (f"(TaskRunner pid=7) step:{k} - timing_s/gen:10.0 - timing_s/update_actor:"
                    f"15.0 - timing_s/step:30.0 - actor/pg_loss:0.01 - perf/throughput:900.0\n")
            line += NOISE * noise
            fh.write(line)
            # two fields (the older form, which the reader before issue 41 also reads)
            sc.write(f"{offset} {now - 30.0 * (n - k) - 60:.6f}\n")
            offset += len(line)
    rows = {}
    for name in ("with", "without"):
        if name == "without":
            os.rename(str(log) + ".arrivals", str(log) + ".kept")
        code = _CHILD.format(root=str(Path(__file__).resolve().parents[1]), log=str(log))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split()
        rows[name] = (float(out[0]), int(out[1]) / 1024.0, int(out[2]), int(out[3]))
    size = log.stat().st_size
    for p in (log, Path(str(log) + ".kept")):
        p.unlink()
    name = "parse_file with a .arrivals sidecar" + (f", {noise} KB of worker lines a step"
                                                      if noise else "")
    return {"path": name, "n": n, "path_s": rows["with"][0],
            "baseline_s": rows["without"][0], "rss_mb": rows["with"][1],
            "baseline_rss_mb": rows["without"][1], "log_mb": size / 2**20,
            "timed_by_sidecar": rows["with"][3]}


def row_text(r: dict) -> str:
    ratio = r["path_s"] / r["baseline_s"] if r["baseline_s"] > 0 else float("inf")
    text = (f"{r['path']:<68} n={r['n']:>7,}  path {r['path_s']:8.3f} s  baseline "
            f"{r['baseline_s']:8.3f} s  ratio {ratio:5.2f}  "
            f"{1e6 * r['path_s'] / r['n']:7.1f} us/step")
    if "resumes" in r:
        text += f"  resumes {r['resumes']} (steps {r['steps']})"
    if "rss_mb" in r:
        text += (f"  peak RSS {r['rss_mb']:.0f} MB (baseline {r['baseline_rss_mb']:.0f} MB, "
                 f"log {r['log_mb']:.0f} MB; {r['timed_by_sidecar']} steps timed by it)")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--out", default=None, help="also write the lines to this file")
    ap.add_argument("--big-log-mb", type=int, default=256,
                    help="also parse a log of 1,000 steps and this many MB of worker lines, "
                    "with and without its sidecar (0: not)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lines = [f"# bench/linear_paths.py on {platform.node()} ({platform.processor() or 'cpu'}, "
             f"{os.cpu_count()} cores), python {platform.python_version()}, "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}; CPU seconds of this process"]
    print(lines[0], flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for n in sizes:
            for fn in (bench_merge, bench_skipped):
                rows.append(fn(n))
                lines.append(row_text(rows[-1]))
                print(lines[-1], flush=True)
            for fn, kw in ((bench_sidecar, {}), (bench_sidecar, {"noise": 1}),
                           (bench_merge_parse, {})):
                rows.append(fn(n, folder, **kw))
                lines.append(row_text(rows[-1]))
                print(lines[-1], flush=True)
        if args.big_log_mb:  # the log's bytes, not its steps: what holding the log costs
            rows.append(bench_sidecar(1000, folder, noise=args.big_log_mb))
            lines.append(row_text(rows[-1]))
            print(lines[-1], flush=True)
    for path in dict.fromkeys(r["path"] for r in rows):
        got = [r for r in rows if r["path"] == path and r["n"] in sizes]
        if len(got) >= 2:
            a, b = got[0], got[-1]
            grow = (b["path_s"] / b["n"]) / (a["path_s"] / a["n"]) if a["path_s"] > 0 else 0
            lines.append(f"{path}: cost a step at n={b['n']:,} / at n={a['n']:,}: {grow:.2f} "
                         f"(1.0 is linear; {b['n'] / a['n']:.0f} would be quadratic)")
            print(lines[-1], flush=True)
    lines.append("rusage maxrss of this process: "
                 f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n" + json.dumps(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
