"""Benchmark the verl log parser against a bare read-and-split baseline, in one run.

Builds a log of realistic console step lines (~3 KB each, 0.7.1-style keys, full-precision
repr values, a Ray prefix) in a temporary folder, then times:

- baseline: read the file line by line, ``line.split(" - ")`` and ``partition(":")`` each field;
- parser:   ``parse_file`` on the same file (streamed reading, numbers converted, canonical
            phases, step records built, end times rebuilt).

- floor:    read, split and ``float()`` every value, keeping nothing: the cost of the number
            conversion the records require (no parser of this format can be faster).

Prints lines/s and MB/s of each and the ratio parser/baseline (aim: >= 0.5). Usage:
``python bench/parse.py [--lines N] [--format console|numpy|jsonl] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.logs.canonical_records import parse_file  # noqa: E402

PHASE_KEYS = (
    "timing_s/agent_loop/slowest/generate_sequences",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/step",
)
OTHER_KEYS = tuple(
    [
        f"actor/{k}"
        for k in (
            "entropy",
            "pg_loss",
            "pg_clipfrac",
            "ppo_kl",
            "pg_clipfrac_lower",
            "kl_loss",
            "kl_coef",
            "grad_norm",
            "lr",
            "reward_kl_penalty",
        )
    ]
    + [
        "perf/mfu/actor",
        "perf/mfu/actor_infer",
        "perf/max_memory_allocated_gb",
        "perf/max_memory_reserved_gb",
        "perf/cpu_memory_used_gb",
        "training/global_step",
        "training/epoch",
        "response/aborted_ratio",
        "perf/total_num_tokens",
        "perf/time_per_step",
        "perf/throughput",
    ]
    + [
        f"critic/{g}/{s}"
        for g in ("score", "rewards", "advantages", "returns")
        for s in ("mean", "max", "min")
    ]
    + [
        f"{g}/{s}"
        for g in ("response_length", "prompt_length", "response_length_non_aborted")
        for s in ("mean", "max", "min", "clip_ratio")
    ]
    + [
        f"global_seqlen/{s}"
        for s in ("min", "max", "minmax_diff", "balanced_min", "balanced_max", "mean")
    ]
    + [
        f"timing_per_token_ms/{p}"
        for p in ("gen", "ref", "values", "adv", "update_critic", "update_actor")
    ]
    + [
        f"timing_s/agent_loop/{a}/{s}"
        for a in ("generate_sequences", "tool_calls", "num_preempted", "compute_score")
        for s in ("min", "max", "mean")
    ]
    + [f"num_turns/{s}" for s in ("min", "max", "mean")]
    + [f"training/rollout_probs_diff_{s}" for s in ("valid", "max", "mean", "std")]
)


def build_metrics(rng: random.Random, step: int) -> dict[str, float | int]:
    metrics: dict[str, float | int] = {}
    for key in PHASE_KEYS:
        metrics[key] = rng.uniform(0.5, 90.0)
    metrics["timing_s/step"] = sum(metrics[k] for k in PHASE_KEYS[1:-1]) + rng.uniform(0, 3)
    for key in OTHER_KEYS:
        metrics[key] = step if key == "training/global_step" else rng.uniform(-2.0, 5000.0)
    return metrics


def build_log(path: Path, lines: int, fmt: str, seed: int = 7) -> int:
    """Write ``lines`` step lines; returns the file size in bytes."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for step in range(1, lines + 1):
            metrics = build_metrics(rng, step)
            if fmt == "jsonl":
                fh.write(json.dumps({"step": step, "data": metrics}) + "\n")
                continue
            if fmt == "fixed3":
                body = " - ".join(f"{k}:{v:.3f}" for k, v in metrics.items())
                prefix = "(TaskRunner pid=2044) "
            elif fmt == "numpy":
                body = " - ".join(f"{k}:np.float64({v!r})" for k, v in metrics.items())
                prefix = "\x1b[36m(TaskRunnerV1 pid=2044, ip=172.16.0.9)\x1b[0m "
            else:
                body = " - ".join(f"{k}:{v!r}" for k, v in metrics.items())
                prefix = "(TaskRunner pid=2044) "
            fh.write(f"{prefix}step:{step} - {body}\n")
    return path.stat().st_size


def baseline(path: Path) -> int:
    """Read and split only: the floor any parser of this format pays."""
    fields = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            for part in line.split(" - "):
                part.partition(":")
                fields += 1
    return fields


def convert_floor(path: Path) -> int:
    """Read, split, and float() every value, keeping nothing: what number conversion alone
    costs (records must hold numbers, so no parser can go below this)."""
    values = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            flat = line.rstrip("\n").replace(" - ", ":").split(":")
            values += len(list(map(float, flat[3::2])))
    return values


def timed(fn, *args) -> tuple[float, object]:
    """CPU seconds of this process (not wall time: other work on a shared machine would
    otherwise leak into the figure), and the result."""
    start = time.process_time()
    result = fn(*args)
    return time.process_time() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000, help="step lines to generate")
    parser.add_argument(
        "--format",
        choices=("console", "fixed3", "numpy", "jsonl"),
        default="console",
        help="console: 0.5-0.8 full-precision repr; fixed3: <=0.4.1 3 decimals; numpy: 0.9 "
        "np.float64(...) with ANSI prefix; jsonl: file logger",
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="interleaved runs of each; the best is kept"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="verlmon-bench-") as tmp:
        path = Path(tmp) / ("bench.jsonl" if args.format == "jsonl" else "bench.log")
        size = build_log(path, args.lines, args.format)
        baseline(path)  # warm the page cache for both contenders
        # Interleaved runs, best of each: a shared machine's noise hits both alike.
        base_s = best = floor_s = float("inf")
        parsed = None
        for _ in range(args.repeat):
            base_s = min(base_s, timed(baseline, path)[0])
            if args.format != "jsonl":
                floor_s = min(floor_s, timed(convert_floor, path)[0])
            seconds, parsed = timed(parse_file, path, 0.0)
            best = min(best, seconds)
        assert parsed is not None
        mb = size / 1e6
        print(
            f"log: {args.lines} lines, {mb:.1f} MB ({size / args.lines:.0f} B/line), "
            f"format {args.format}"
        )
        print("CPU time of this process, best of interleaved runs")
        print(
            f"baseline (read+split+partition): {args.lines / base_s:,.0f} lines/s, "
            f"{mb / base_s:.1f} MB/s, {base_s:.2f} s"
        )
        if args.format != "jsonl":
            print(
                f"floor    (split+float() values): {args.lines / floor_s:,.0f} lines/s, "
                f"{mb / floor_s:.1f} MB/s, {floor_s:.2f} s (ratio {base_s / floor_s:.2f})"
            )
        print(
            f"parser   (parse_file):           {args.lines / best:,.0f} lines/s, "
            f"{mb / best:.1f} MB/s, {best:.2f} s"
        )
        print(f"ratio parser/baseline: {base_s / best:.2f}  (aim >= 0.5)")
        print(
            f"records: {len(parsed.steps)}, parse errors: {parsed.stats.parse_errors}, "
            f"version guess: {parsed.version_guess}"
        )
        if len(parsed.steps) != args.lines or parsed.stats.parse_errors:
            print("error: the parser lost lines", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
