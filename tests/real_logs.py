"""Real verl logs from public repositories, and the clocks to judge them by.

``tests/fixtures/real_logs/manifest.json`` names each log: the repository, commit and path it
was read from, its sha256, its licence, the trainer that wrote it and the clock it carries.
A log is read from ``tests/fixtures/real_logs/<name>.log`` when that file is there, else from
``../shared/real_logs/<name>.log`` (beside the repository: where the steering repo places the
ones whose licence allows it), else from a local snapshot of its repository
(``/work/.mirror/<owner>+<repo>/repo``, or the folder in ``VERL_MONITOR_MIRRORS``) at the
recorded commit, whichever first has the recorded bytes; ``load`` returns None when none
has them.

Reference clocks, read here independently of the monitor's parser:

- ``tqdm``: the ``Training Progress`` bar's elapsed time at its last drawing less the one at
  its first (the bar is drawn once before the first step and once after each).
- ``wandb_runtime``: the ``_runtime`` wandb recorded with each step's history in the run's
  ``.wandb`` file beside the captured ``output.log`` (seconds since ``wandb.init``); the
  reference is the time from the first step's record to the last one's.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "fixtures" / "real_logs"
MANIFEST = HERE / "manifest.json"
MIRRORS = Path(os.environ.get("VERL_MONITOR_MIRRORS", "/work/.mirror"))
#: Logs placed beside the repository by the steering repo (``shared/real_logs/<name>.log``).
SHARED = Path(__file__).resolve().parents[2] / "shared" / "real_logs"

_TQDM_RE = re.compile(r"Training Progress:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s*\[([\d:]+)<")
_RUNTIME_RE = re.compile(rb"_runtime.{1,4}?(\d+(?:\.\d+)?)", re.S)
_GLOBAL_STEP_RE = re.compile(rb"training/global_step.{1,4}?(\d+)", re.S)


@dataclass
class RealLog:
    """One manifest entry."""

    name: str
    repo: str
    commit: str
    path: str
    sha256: str
    licence: str
    mode: str
    verl: str
    clock: str | None
    healthy: bool
    what: str
    wandb: str | None = None


def entries() -> list[RealLog]:
    """Every log of the manifest."""
    return [RealLog(**item) for item in json.loads(MANIFEST.read_text())]


def _git_show(entry: RealLog, path: str) -> bytes | None:
    repo = MIRRORS / entry.repo.replace("/", "+") / "repo"
    if not repo.is_dir():
        return None
    try:
        done = subprocess.run(["git", "-C", str(repo), "show", f"{entry.commit}:{path}"],
                              capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def load(entry: RealLog, cache: Path) -> Path | None:
    """The log as a local file (under ``cache`` when taken from a snapshot), or None."""
    for placed in (HERE / f"{entry.name}.log", SHARED / f"{entry.name}.log"):
        if placed.is_file() and hashlib.sha256(placed.read_bytes()).hexdigest() == entry.sha256:
            return placed
    data = _git_show(entry, entry.path)
    if data is None or hashlib.sha256(data).hexdigest() != entry.sha256:
        return None
    out = cache / f"{entry.name}.log"
    out.write_bytes(data)
    return out


def tqdm_wall(text: str) -> float | None:
    """Seconds from the bar's first drawing to its last, or None without two drawings."""
    seen = [_clock(m.group(3)) for m in _TQDM_RE.finditer(text)]
    seen = [s for s in seen if s is not None]
    return seen[-1] - seen[0] if len(seen) >= 2 else None


def _clock(text: str) -> float | None:
    total = 0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return float(total)


def wandb_runtimes(entry: RealLog) -> dict[int, float] | None:
    """``training/global_step -> _runtime`` from the run's ``.wandb`` file (each step's value
    is the ``_runtime`` nearest its ``training/global_step`` in the file), or None."""
    if not entry.wandb:
        return None
    data = _git_show(entry, entry.wandb)
    if not data:
        return None
    runtimes = [(m.start(), float(m.group(1))) for m in _RUNTIME_RE.finditer(data)]
    where = [p for p, _ in runtimes]
    out: dict[int, float] = {}
    for m in _GLOBAL_STEP_RE.finditer(data):
        k = bisect.bisect_left(where, m.start())
        near = [runtimes[i] for i in (k - 1, k) if 0 <= i < len(runtimes)]
        if near:
            pos, value = min(near, key=lambda c: abs(c[0] - m.start()))
            if abs(pos - m.start()) < 20_000:
                out.setdefault(int(m.group(1)), value)
    return out or None


def analyze_doc(log: Path, gpu: Path | None = None, log_end: float | None = None) -> dict:
    """``verl-monitor analyze --json``'s document for ``log`` (and ``gpu`` samples)."""
    import argparse

    from cli.commands.analyze import build_document

    args = argparse.Namespace(log=str(log), gpu=str(gpu) if gpu else None, host=None,
                              events=None, nccl=None, rollout=None, log_end=log_end,
                              config=None, wandb=None, gpu_hour_cost=None, trainer_gpus=None,
                              rollout_gpus=None, fr_dir=None, json=True)
    return build_document(args)


def reference_wall(entry: RealLog, log: Path, steps: list[Any]) -> float | None:
    """The log's own clock for the time its steps took (see the module docstring)."""
    if entry.clock == "tqdm":
        return tqdm_wall(log.read_text(errors="replace"))
    if entry.clock == "wandb_runtime" and steps:
        runtimes = wandb_runtimes(entry)
        first, last = steps[0].step, steps[-1].step
        if runtimes and first in runtimes and last in runtimes:
            return runtimes[last] - runtimes[first]
    return None


def _ratio(metrics: dict[str, Any], top: str, mean: str) -> float | None:
    try:
        return float(metrics[top]) / float(metrics[mean])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def long_tail_is_true(flag: dict[str, Any], metrics: dict[int, dict[str, Any]]) -> str:
    """rollout_long_tail is true of a step range when the log's own figures show the tail:
    over the flagged steps, the longest response at least 4x the mean length and the slowest
    sample's generation at least 2x the mean one (median over the steps; the ledger counts a
    tail from 2x, goodput.tail_min_response_ratio). On these runs: 4.4x-184x and 2.4x-43x.
    Returns what is wrong, or ''."""
    first, last = flag["scope"]["steps"]
    resp = [r for n in range(first, last + 1)
            if (r := _ratio(metrics.get(n, {}), "response_length/max", "response_length/mean"))]
    gen = [r for n in range(first, last + 1)
           if (r := _ratio(metrics.get(n, {}), "timing_s/agent_loop/generate_sequences/max",
                           "timing_s/agent_loop/generate_sequences/mean"))]
    if not resp or not gen:
        return "no response_length / agent_loop timers in the flagged steps"
    r, g = statistics.median(resp), statistics.median(gen)
    return "" if r >= 4.0 and g >= 2.0 else f"longest/mean response {r:.1f}x, generation {g:.1f}x"


#: Warnings that real healthy runs raise and that are true of them: kind -> the check, on the
#: log's own numbers, that makes the flag true (it returns what is wrong, or '').
TRUE_OBSERVATIONS: dict[str, Callable[[dict[str, Any], dict[int, dict[str, Any]]], str]] = {
    "rollout_long_tail": long_tail_is_true,
}


def false_flags(doc: dict[str, Any], log: Path) -> list[str]:
    """Each warning or critical flag of ``analyze``'s document that is not a true observation
    of the run (see ``TRUE_OBSERVATIONS``), in words; empty when all are."""
    from monitor.logs.canonical_records import parse_file

    metrics = {s.step: s.metrics for s in parse_file(log).steps}
    wrong = []
    for flag in doc["flags"]:
        if flag["severity"] not in ("warning", "critical"):
            continue
        check = TRUE_OBSERVATIONS.get(flag["kind"])
        why = "not a true observation" if check is None else check(flag, metrics)
        if why:
            wrong.append(f"{flag['kind']} ({flag['severity']}): {flag['evidence']} -- {why}")
    return wrong
