"""Real verl logs of public repositories through ``verl-monitor analyze``: the wall time
against the log's own clock, the trainer read, the flags.

The logs are named in ``tests/fixtures/real_logs/manifest.json`` (``tests/real_logs.py`` finds
them: committed beside it, placed in ``../shared/real_logs/``, or in a local snapshot of their
repository). For each log: where it was read from, the trainer mode and version read, the clock the end times came from, the wall time measured from
the first step's start to the last step's end against the log's own clock (tqdm's elapsed
time, or wandb's ``_runtime`` from the first step's record to the last), and every warning or
critical flag with its first line of advice; for a healthy run, whether each of those flags is
a true observation of it (``tests.real_logs.TRUE_OBSERVATIONS``, the numbers that make it so).

    .venv/bin/python bench/real_logs.py [--out bench/results/real_logs.txt]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from monitor.logs.canonical_records import parse_file  # noqa: E402
from tests.real_logs import (  # noqa: E402
    HERE,
    SHARED,
    analyze_doc,
    captured_wall,
    entries,
    false_flags,
    load,
    reference_wall,
    wandb_wall,
)


def _read_from(log: Path) -> str:
    if log.parent == HERE:
        return "committed copy"
    if log.parent == SHARED:
        return "../shared/real_logs"
    return "snapshot of the repository"


def measure(cache: Path) -> list[str]:
    """One block of text per manifest entry."""
    out = []
    for entry in entries():
        log = load(entry, cache)
        head = f"{entry.name}  ({entry.repo}@{entry.commit[:10]}:{entry.path})"
        if log is None:
            out.append(f"{head}\n  not available here (no committed copy, no snapshot)\n")
            continue
        doc = analyze_doc(log)
        steps = parse_file(log).steps
        wall = doc["summary"]["wall"]
        ours = wall.get("span_s")
        if entry.clock == "tqdm_captured":
            ours = captured_wall(log, steps)
        ref = reference_wall(entry, log, steps)
        source = {"config": " from the printed config"}.get(doc.get("trainer_mode_source"), "")
        lines = [head,
                 f"  read from: {_read_from(log)}",
                 f"  trainer read {doc['trainer_mode']}{source} (expected {entry.mode}), version "
                 f"{doc['version_guess']} (log: verl {entry.verl}); {len(steps)} steps",
                 f"  clock used: {wall.get('clock')}; the log's own clock: {entry.clock or 'none'}"]
        span = {"tqdm": "first step's start to last step's end",
                "tqdm_captured": "first step's start to the end of the step of the bar's "
                                 "last captured count"}.get(entry.clock or "", "")
        if ours is not None and ref:
            lines.append(f"  wall ({span}) {ours:.0f} s vs the log's clock {ref:.0f} s: "
                         f"{100 * (ours / ref - 1):+.2f}%")
        elif ours is not None:
            lines.append(f"  wall {ours:.0f} s (no clock in the log)")
        pair = wandb_wall(entry, steps)
        if pair:
            lines.append(f"  whole run, first to last step record, vs wandb's _runtime (the "
                         f".wandb file): {pair[0]:.0f} s vs {pair[1]:.0f} s: "
                         f"{100 * (pair[0] / pair[1] - 1):+.2f}%")
        if entry.stated:
            lines.append(f"  the run's own account: {entry.stated}")
        flags = [f for f in doc["flags"] if f["severity"] in ("warning", "critical")]
        kinds: dict[str, int] = {}
        for f in flags:
            kinds[f"{f['kind']} ({f['severity']})"] = kinds.get(
                f"{f['kind']} ({f['severity']})", 0) + 1
        lines.append("  flags: " + (", ".join(f"{k} x{v}" for k, v in kinds.items())
                                    if kinds else "none"))
        seen = set()
        for f in flags:
            if f["kind"] in seen:
                continue
            seen.add(f["kind"])
            advice = (f.get("advice") or ["-"])[0]
            lines.append(f"    {f['kind']}: {f.get('evidence', '')} | advice: {advice}")
        if entry.healthy:
            wrong = false_flags(doc, log)
            lines.append("  healthy run: " + ("; ".join(wrong) if wrong else
                                              "no false flag (each warning a true observation)"))
        out.append("\n".join(lines) + "\n")
    return out


def main() -> int:
    """Print (and with ``--out`` write) the measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        text = "\n".join(measure(Path(tmp)))
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
