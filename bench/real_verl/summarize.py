"""Per real-verl recording: steps, the log's own clock against the monitor's, and the flags
``verl-monitor analyze`` gives today with each one's first line of advice.

    python3 bench/real_verl/summarize.py [tests/fixtures/real_verl [CASE ...]] > bench/results/...
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import textwrap
from pathlib import Path

try:  # the console script's entry point (cli/main.py since the package split)
    from cli.main import main as cli
except ImportError:
    from monitor.cli import main as cli

TQDM = re.compile(r"Training Progress:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+) \[(\d+):(\d+)<")
GRAD_NORM = re.compile(r"actor/grad_norm:(?:np\.float64\()?([-+\w.]+)")
#: a fault and the same job without it, compared step by step on update_actor
PAIRS = {"opt_offload": "healthy_big", "opt_offload_xl": "healthy_xl"}


def analyze(d: Path, log: str) -> dict:
    """``verl-monitor analyze`` of one recording, as JSON."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        cli(["analyze", str(d / log), "--gpu", str(d / "gpu.csv"), "--host", str(d / "host.csv"),
             "--events", str(d / "events.json"), "--stacks", str(d / "stacks"), "--json"])
    return json.loads(out.getvalue())


def tqdm_clock(d: Path) -> str:
    found = TQDM.findall((d / "train.log").read_text(errors="replace"))
    if not found:
        return "no tqdm line"
    done, total, mm, ss = found[-1]
    return f"{done}/{total} steps in {int(mm) * 60 + int(ss)} s (tqdm elapsed)"


def grad_norms(d: Path) -> str:
    """How many steps' actor/grad_norm (as verl printed it) were not finite: verl skips those
    optimizer steps."""
    norms = [float(v) for v in GRAD_NORM.findall((d / "train.log").read_text(errors="replace"))]
    bad = sum(1 for n in norms if n != n or n in (float("inf"), float("-inf")))
    return f"actor/grad_norm not finite in {bad} of {len(norms)} steps" + (
        " (verl skipped those optimizer steps)" if bad else "")


def pair_text(root: Path, fault: str, base: str) -> str:
    """update_actor seconds per step of ``fault`` against ``base``, from analyze's steps."""
    per = {}
    for run in (fault, base):
        per[run] = [s["phases"].get("update_actor", 0.0)
                    for s in analyze(root / run, "train.log")["steps"]]
    med = {r: sorted(v[1:])[len(v[1:]) // 2] for r, v in per.items()}
    return "\n".join([f"== update_actor s/step, {fault} vs {base}"] + [
        f"   {r:<15} " + " ".join(f"{x:5.2f}" for x in v) + f"   median of steps 2+: {med[r]:.2f}"
        for r, v in per.items()] + [f"   ratio of the medians {med[fault] / med[base]:.2f}; "
                                    f"step 1 {per[fault][0] / per[base][0]:.1f}x"])


def _span(report: dict) -> str:
    w = report["summary"].get("wall") or {}
    if not w.get("span_s"):
        return "no steps"
    return f"{w['span_s']:.1f} s ({w.get('clock')} clock)"


def _since_progress(report: dict, t: float) -> str:
    """``t`` against the last step that ended before it (the log's own step lines)."""
    before = [s for s in report["steps"] if s["end_time"] <= t]
    if not before:
        return "before the first step"
    last = max(before, key=lambda s: s["end_time"])
    return f"{t - last['end_time']:+.1f} s after step {last['step']} ended"


def case_text(d: Path) -> str:
    meta = json.loads((d / "meta.json").read_text())
    console, store = analyze(d, "train.log"), analyze(d, "train.jsonl")
    lines = [f"== {meta['case']}: {meta['what']}",
             f"   verl {meta['verl_commit'][:8]} ({meta['verl_version']}, rollout {meta['rollout']}),"
             f" model {meta['model']}, {meta.get('batch', 32)} prompts x 4, attention "
             f"{meta.get('attn', 'sdpa')}, knobs {meta['knobs'] or 'none'}, reward {meta['reward']}",
             f"   run: rc {meta['rc']}, {meta['last_step']} of {meta['steps']} steps, "
             f"{meta['wall_s']} s under verl-monitor run, ended by {meta['ended_by']}"
             + (f", alongside {', '.join(meta['concurrent_with'])}"
                if meta.get("concurrent_with") else ""),
             f"   log's own clock: {tqdm_clock(d)}; analyze of the console log: {_span(console)};"
             f" of the store's train.jsonl: {_span(store)}",
             f"   version: console {console['version_guess']}, jsonl {store['version_guess']}",
             f"   {grad_norms(d)}"]
    for name, m in (meta.get("injected") or {}).items():
        lines.append(f"   injected: {name} at step {m.get('step')} (pid {m.get('pid')}), "
                     f"{_since_progress(console, m['ts'])}")
    flags = [f for f in console["flags"] if f["severity"] in ("warning", "critical")]
    lines.append(f"   flags (analyze --stacks, today): {len(flags) or 'none'}")
    for f in flags:
        lines.append(f"   - {f['kind']} {f['severity']} {f['scope']}, opens "
                     f"{_since_progress(console, f['start'])}")
        lines += textwrap.wrap("evidence: " + f["evidence"], 100, initial_indent="       ",
                               subsequent_indent="         ")
        lines += textwrap.wrap("advice 1: " + f["advice"][0], 100, initial_indent="       ",
                               subsequent_indent="         ")
    live = json.loads((d / "flags_live.json").read_text()) if (d / "flags_live.json").exists() \
        else []
    lines.append(f"   live exporter's flags in the store: {len(live) or 'none'}")
    for f in live:
        lines.append(f"   - live {f['kind']} {f['severity']} {f['scope']}, opens "
                     f"{_since_progress(console, f['start'])}"
                     + (f", closes {_since_progress(console, f['end'])}" if f.get("end") else ""))
        lines += textwrap.wrap("evidence: " + f["evidence"], 100, initial_indent="       ",
                               subsequent_indent="         ")
        lines += textwrap.wrap("advice 1: " + f["advice"][0], 100, initial_indent="       ",
                               subsequent_indent="         ")
    return "\n".join(lines)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/real_verl")
    only = set(sys.argv[2:])  # case names to summarize (default: every one)
    for d in sorted(p for p in root.iterdir() if (p / "meta.json").exists()):
        if not only or d.name in only:
            print(case_text(d) + "\n")
    for fault, base in PAIRS.items():
        if (root / fault).is_dir() and (root / base).is_dir() and (
                not only or {fault, base} <= only):
            print(pair_text(root, fault, base) + "\n")


if __name__ == "__main__":
    main()
