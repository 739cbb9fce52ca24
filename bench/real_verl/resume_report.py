"""The ledger across the attempts of the ``kill_resume`` case, from every surface, beside what
verl's own log says.

The case (``cases.py``) runs verl under ``verl-monitor run`` twice with one ``--log`` (appended)
and one ``--store``: attempt 1 SIGKILLed once step 5's line is out, attempt 2 with
``trainer.resume_mode=auto``. This prints, for the case's folder (unpacked from the device's
``real_verl.tar.gz``):

1. verl's own words: the ``.attempts`` marks, each attempt's step lines, its
   ``timing_s/save_checkpoint``, its ``Load from checkpoint folder`` / ``Setting global step``
   lines, and the checkpoint folder at the kill and at the end;
2. ``verl-monitor analyze train.log`` (the one appended log, split by ``train.log.attempts``);
3. ``verl-monitor analyze a1.log a2.log``: the log cut at the attempts' offsets into one file
   per attempt (capture times kept), no ``.attempts``: each file is an attempt;
4. ``verl-monitor analyze export/train.jsonl --events export/events.json`` (the store exported);
5. the run store's own ledger (``job_history`` + ``job_ledger``, what the exporter's attempts
   view and the dashboard's Job page book), as numbers.

    python bench/real_verl/resume_report.py RUN/kill_resume [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from monitor.analysis.attempts import job_ledger, ledger_numbers  # noqa: E402
from monitor.cli import main as cli  # noqa: E402
from monitor.logs.arrivals import SUFFIX as ARRIVALS  # noqa: E402
from monitor.logs.attempt_marks import marks_path  # noqa: E402
from monitor.store import RunStore  # noqa: E402
from monitor.store.job_history import job_history  # noqa: E402

VERL_LINES = re.compile(r"Load from checkpoint folder|Setting global step|Resuming from|"
                        r"Training from scratch|No dataloader state|Training Progress: 100%")
STEP = re.compile(r"step:(\d+) - ")
SAVE = re.compile(r"timing_s/save_checkpoint:(?:np\.float64\()?([0-9.]+)")
TIMING_STEP = re.compile(r"timing_s/step:(?:np\.float64\()?([0-9.]+)")


def marks(log: Path) -> list[dict]:
    path = marks_path(log)
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []


def split_log(log: Path, out: Path) -> list[Path]:
    """``log`` cut at each attempt's ``offset`` into ``out/a<N>.log``, each with its capture
    times re-based (``.arrivals``: ``<offset> <ts> <end>``)."""
    starts = [m["offset"] for m in marks(log) if m.get("event") == "start"]
    data = log.read_bytes()
    bounds = list(zip(starts, starts[1:] + [len(data)], strict=True))
    arrivals = []
    side = log.with_name(log.name + ARRIVALS)
    if side.exists():
        for line in side.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                arrivals.append([int(parts[0]), parts[1], *[int(p) for p in parts[2:3]]])
    out.mkdir(parents=True, exist_ok=True)
    logs = []
    for i, (lo, hi) in enumerate(bounds, 1):
        part = out / f"a{i}.log"
        part.write_bytes(data[lo:hi])
        rows = [f"{a[0] - lo} {a[1]}" + (f" {min(a[2], hi) - lo}" if len(a) > 2 else "")
                for a in arrivals if lo <= a[0] < hi]
        part.with_name(part.name + ARRIVALS).write_text("\n".join(rows) + ("\n" if rows else ""))
        logs.append(part)
    return logs


def verl_says(case: Path) -> list[str]:
    """What verl's log and the harness recorded, attempt by attempt."""
    log = case / "train.log"
    out = ["== verl's log and the harness", f"{marks_path(log).name}:"]
    out += [f"  {json.dumps(m)}" for m in marks(log)]
    data = log.read_bytes()
    starts = [m["offset"] for m in marks(log) if m.get("event") == "start"] or [0]
    for i, (lo, hi) in enumerate(zip(starts, starts[1:] + [len(data)], strict=True), 1):
        text = data[lo:hi].decode("utf-8", "replace")
        steps, saves = [], []
        for line in text.splitlines():
            m = STEP.search(line)
            if m:
                t = TIMING_STEP.search(line)
                s = SAVE.search(line)
                steps.append(f"{m.group(1)} ({float(t.group(1)):.1f} s"
                             + (f", save {float(s.group(1)):.2f} s" if s else "") + ")"
                             if t else m.group(1))
                if s:
                    saves.append(m.group(1))
        out.append(f"attempt {i} (log bytes {lo}-{hi}): steps {', '.join(steps) or 'none'}; "
                   f"saves at steps {', '.join(saves) or 'none'}")
        out += [f"  | {ln.strip()[:200]}" for ln in text.splitlines() if VERL_LINES.search(ln)]
    for name in ("ckpt_after_kill.txt", "ckpt_at_end.txt"):
        f = case / name
        if f.exists():
            lines = f.read_text().splitlines()
            dirs = sorted({ln.split()[1].split("/")[0] for ln in lines[1:] if len(ln.split()) > 1
                           and ln.split()[1].startswith("global_step_")},
                          key=lambda d: int(d.split("_")[-1]))
            out.append(f"{name}: {lines[0].lstrip('# ')}; folders {', '.join(dirs) or 'none'}")
    meta = case / "meta.json"
    if meta.exists():
        m = json.loads(meta.read_text())
        for t in m.get("attempts") or []:
            out.append(f"harness attempt {t['attempt']}: rc {t['rc']}, wall {t['wall_s']} s, "
                       f"last step {t['last_step']}, ended by {t['ended_by']}")
        if m.get("between"):
            out.append(f"between the attempts: {m['between']}")
    return out


def analyze(args: list[str]) -> tuple[str, dict]:
    """``verl-monitor analyze ARGS``: its "Attempts of the job" section and its ``attempts``
    JSON object."""
    text, js = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        cli(["analyze", *args])
    with contextlib.redirect_stdout(js), contextlib.redirect_stderr(io.StringIO()):
        cli(["analyze", *args, "--json"])
    body = text.getvalue()
    section = body.split("Attempts of the job\n", 1)
    shown = ("Attempts of the job\n" + section[1].split("\n\n")[0]) if len(section) > 1 \
        else "(no 'Attempts of the job' section)"
    return shown, json.loads(js.getvalue()).get("attempts") or {}


def numbers(ledger: dict) -> str:
    n = ledger_numbers(ledger) if ledger.get("attempts") else {}
    keep = ("attempts", "failures", "steps_redone", "checkpoint_saves", "ettr", "wall_s")
    head = ", ".join(f"{k} {n[k]:g}" for k in keep if k in n)
    per = "; ".join(f"#{a['attempt']} {a['ended_by']} steps {a['first_step']}-{a['last_step']}"
                    f" redone {a['redone_steps']} saves {a['saves']} resumed_from "
                    f"{a['resumed_from']}" for a in ledger.get("attempts") or [])
    secs = ", ".join(f"{k} {v:.1f}" for k, v in (ledger.get("seconds") or {}).items() if v)
    costs = "; ".join(f"#{c['attempt']} {c['ended_by']}: {c['seconds']:.1f} s to step "
                      f"{c['step']} again" for c in ledger.get("failure_costs") or [])
    return f"  {head}\n  {per}\n  seconds: {secs}\n  failure costs: {costs or 'none'}"


def report(case: Path) -> str:
    out = verl_says(case)
    log = case / "train.log"
    runs = [("verl-monitor analyze train.log (one log, appended; train.log.attempts)",
             [str(log)])]
    parts = split_log(log, case / "split")
    if len(parts) > 1:
        runs.append((f"verl-monitor analyze {' '.join(p.name for p in parts)} (the log cut "
                     "at the attempts' offsets, capture times kept, no .attempts)",
                     [str(p) for p in parts]))
    exp = case / "export"
    if (exp / "train.jsonl").exists():
        runs.append(("verl-monitor analyze export/train.jsonl --events export/events.json "
                     "(the store exported)",
                     [str(exp / "train.jsonl"), "--events", str(exp / "events.json")]))
    for title, args in runs:
        shown, ledger = analyze(args)
        out += ["", f"== {title}", shown, "numbers:", numbers(ledger)]
    if (case / "store.db").exists():
        store = RunStore(case / "store.db", create=False)
        ledger = job_ledger(*job_history(store))
        out += ["", "== the run store's ledger (job_history + job_ledger: the exporter's "
                "attempts view, the dashboard's Job page)", numbers(ledger)]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", type=Path, help="the case's folder (train.log, export/, store.db)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    text = report(a.case)
    if a.out:
        a.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
