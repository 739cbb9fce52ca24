"""Real verl logs from public repositories, and the clocks to judge them by.

``tests/fixtures/real_logs/manifest.json`` names each log: the repository, commit and path it
was read from, its sha256, its licence, the trainer that wrote it and the clock it carries.
A log is read from ``tests/fixtures/real_logs/<name>.log`` when that file is there, else from a
local snapshot of its repository (``/work/.mirror/<owner>+<repo>/repo``, or the folder in
``VERL_MONITOR_MIRRORS``) at the recorded commit; ``load`` returns None when neither is there,
or when the bytes are not the recorded ones.

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
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "fixtures" / "real_logs"
MANIFEST = HERE / "manifest.json"
MIRRORS = Path(os.environ.get("VERL_MONITOR_MIRRORS", "/work/.mirror"))

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
    committed = HERE / f"{entry.name}.log"
    data = committed.read_bytes() if committed.is_file() else _git_show(entry, entry.path)
    if data is None or hashlib.sha256(data).hexdigest() != entry.sha256:
        return None
    if committed.is_file():
        return committed
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
