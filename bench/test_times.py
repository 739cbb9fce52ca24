"""The test suite's time, per test and per file: the tables of issue 36, and the durations the
scheduler orders the work by.

    .venv/bin/python -m pytest --times-json /tmp/times.json ...   # any run, serial or -n N
    .venv/bin/python bench/test_times.py /tmp/times.json --out bench/results/test_times_X.txt
    .venv/bin/python bench/test_times.py /tmp/times.json --durations tests/durations.json

Each row: wall seconds, the test process's own CPU seconds, the CPU seconds of the child
processes it reaped (the CLI, exporters, Prometheus, Chromium, pip), and the rest: waiting
(sleeps, real-time playback, scrapes, server start-ups, downloads, and other processes' turn on
a shared machine). ``--compare OTHER.json`` adds the other run's totals beside these.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Tests shorter than this are left out of the durations file (the scheduler's default).
MIN_RECORDED_S = 0.2


def _load(path: str) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    return {"elapsed_s": float(data.get("elapsed_s", 0.0)), "tests": data["tests"]}


def _files(tests: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"wall": 0.0, "cpu": 0.0,
                                                            "child_cpu": 0.0, "tests": 0})
    for nodeid, row in tests.items():
        agg = out[nodeid.split("::", 1)[0]]
        for k in ("wall", "cpu", "child_cpu"):
            agg[k] += float(row[k])
        agg["tests"] += 1
    return out


def _row(name: str, r: dict[str, float]) -> str:
    wait = max(0.0, r["wall"] - r["cpu"] - r["child_cpu"])
    return (f"{r['wall']:9.1f} {r['cpu']:8.1f} {r['child_cpu']:8.1f} {wait:9.1f}  {name}")


def _totals(run: dict[str, Any]) -> dict[str, float]:
    tests = run["tests"]
    return {"tests": len(tests), "elapsed": run["elapsed_s"],
            **{k: sum(float(r[k]) for r in tests.values()) for k in ("wall", "cpu",
                                                                     "child_cpu")}}


def table(run: dict[str, Any], top: int = 40) -> str:
    """The text table: totals, the slowest files and the slowest tests."""
    tests = run["tests"]
    t = _totals(run)
    lines = [f"{t['tests']} tests, {t['elapsed']:.0f} s elapsed; test time {t['wall']:.0f} s = "
             f"{t['cpu']:.0f} s own CPU + {t['child_cpu']:.0f} s children's CPU + "
             f"{max(0.0, t['wall'] - t['cpu'] - t['child_cpu']):.0f} s waiting",
             "", "     wall      cpu    child      wait  file (tests)"]
    files = _files(tests)
    for name, r in sorted(files.items(), key=lambda kv: -kv[1]["wall"])[:top]:
        lines.append(_row(f"{name} ({int(r['tests'])})", r))
    lines += ["", "     wall      cpu    child      wait  test"]
    for name, r in sorted(tests.items(), key=lambda kv: -kv[1]["wall"])[:top]:
        lines.append(_row(name, r))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("times", help="the JSON a pytest run wrote with --times-json")
    p.add_argument("--out", help="write the table here (else print it)")
    p.add_argument("--durations", help="write nodeid -> wall seconds here (tests/durations.json)")
    p.add_argument("--compare", help="another run's --times-json, for its totals beside these")
    p.add_argument("--top", type=int, default=40, help="rows of files and of tests (40)")
    args = p.parse_args(argv)
    run = _load(args.times)
    text = table(run, args.top)
    if args.compare:
        other, this = _totals(_load(args.compare)), _totals(run)
        text = (f"compared with {args.compare}: elapsed {other['elapsed']:.0f} s -> "
                f"{this['elapsed']:.0f} s ({this['elapsed'] / max(other['elapsed'], 1e-9):.2f}x),"
                f" tests {other['tests']} -> {this['tests']}, own CPU {other['cpu']:.0f} -> "
                f"{this['cpu']:.0f} s, children's CPU {other['child_cpu']:.0f} -> "
                f"{this['child_cpu']:.0f} s\n\n") + text
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    if args.durations:
        rows = {k: round(float(v["wall"]), 1) for k, v in sorted(run["tests"].items())
                if float(v["wall"]) >= MIN_RECORDED_S}
        Path(args.durations).write_text(json.dumps(rows, indent=0) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
