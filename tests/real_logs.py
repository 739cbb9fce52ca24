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
- ``tqdm_captured``: a console capture that kept only the bar's last state where the bar was
  first printed (wandb's ``output.log`` freezes the bar's line once it scrolls out of its
  terminal emulator's window): its count N and elapsed time E say that step N ended E seconds
  after the bar's start; the reference is the last such drawing (from the bar's start, which
  is the first step's start, to step N's end).
- ``wandb``: the run's ``.wandb`` file beside the captured ``output.log``, when the manifest
  names it: wandb commits a step's history row when the next step is logged, so the row of
  step k - 1 carries the ``_runtime`` (seconds since ``wandb.init``) at which step k was
  logged, right after its timers stopped: step k's end. Read record by record (wandb's
  LevelDB-style log of ``Record`` protobufs, with the ``wandb`` package's own message types).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import struct
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
#: wandb's datastore: a 7-byte header, then 32 KiB blocks of records (crc32, length, type)
_WANDB_HEADER = 7
_WANDB_BLOCK = 32768


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
    #: the run's own account of its wall time, where the text has one (a launcher's elapsed
    #: seconds, a README's table), for the record
    stated: str | None = None


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


def tqdm_captured(text: str) -> tuple[int, float] | None:
    """(count, elapsed seconds) of the bar's last captured drawing, or None."""
    seen = [(int(m.group(1)), _clock(m.group(3))) for m in _TQDM_RE.finditer(text)]
    seen = [(n, e) for n, e in seen if e is not None]
    return max(seen, key=lambda item: item[1]) if seen else None  # type: ignore[return-value]


def _wandb_records(data: bytes) -> list[bytes]:
    """The records of a ``.wandb`` file (full, or first/middle/last pieces joined)."""
    out: list[bytes] = []
    pos, pending = _WANDB_HEADER, b""
    while pos + 7 <= len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < 7:
            pos += left  # a block's tail too short for a header is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
            pending = b""
    return out


def wandb_step_ends(entry: RealLog) -> dict[int, float] | None:
    """``step -> _runtime`` at which wandb was given the step's metrics (its end): the
    ``_runtime`` of the row of the step before it (see the module docstring); None without
    the ``.wandb`` file or the ``wandb`` package."""
    if not entry.wandb:
        return None
    data = _git_show(entry, entry.wandb)
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError:
        return None
    if not data:
        return None
    committed: dict[int, float] = {}
    for raw in _wandb_records(data):
        record = pb.Record()
        try:
            record.ParseFromString(raw)
        except Exception:  # a torn record at the file's end
            continue
        if record.WhichOneof("record_type") != "history":
            continue
        items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
        if "training/global_step" in items and "_runtime" in items:
            committed.setdefault(int(float(items["training/global_step"])),
                                 float(items["_runtime"]))
    return {k + 1: t for k, t in committed.items()} or None


def analyze_doc(log: Path, gpu: Path | None = None, log_end: float | None = None) -> dict:
    """``verl-monitor analyze --json``'s document for ``log`` (and ``gpu`` samples)."""
    import argparse

    from cli.commands.analyze import NoVerlLines, build_document

    args = argparse.Namespace(log=str(log), gpu=str(gpu) if gpu else None, host=None,
                              events=None, nccl=None, rollout=None, log_end=log_end,
                              config=None, wandb=None, gpu_hour_cost=None, trainer_gpus=None,
                              rollout_gpus=None, fr_dir=None, json=True)
    try:
        return build_document(args)
    except NoVerlLines as exc:  # analyze says so and exits 2: no flag, no advice
        return {"flags": [], "no_verl_lines": str(exc)}


def reference_wall(entry: RealLog, log: Path, steps: list[Any]) -> float | None:
    """The log's own clock for the time its steps took (see the module docstring): the tqdm
    bar's first to last drawing, or the bar's start to its last captured drawing."""
    text = log.read_text(errors="replace")
    if entry.clock == "tqdm":
        return tqdm_wall(text)
    if entry.clock == "tqdm_captured":
        seen = tqdm_captured(text)
        return seen[1] if seen else None
    return None


def captured_wall(log: Path, steps: list[Any]) -> float | None:
    """The monitor's time from the first step's start to the end of the step whose number is
    the bar's last captured count (``tqdm_captured``), or None."""
    from monitor.logs.clocks import covered_seconds

    seen = tqdm_captured(log.read_text(errors="replace"))
    ends = [s for s in steps if seen and s.step == seen[0]]
    if not steps or not ends:
        return None
    return ends[-1].end_time - (steps[0].end_time - covered_seconds(steps[0]))


def wandb_wall(entry: RealLog, steps: list[Any]) -> tuple[float, float] | None:
    """(ours, wandb's) seconds from the first step whose end wandb recorded to the last
    step's end, or None."""
    ends = wandb_step_ends(entry)
    if not ends or not steps:
        return None
    last = steps[-1]
    first = next((s for s in steps if s.step in ends), None)
    if first is None or last.step not in ends:
        return None
    return last.end_time - first.end_time, ends[last.step] - ends[first.step]


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


#: The trainer's own weight-sync timers, as each trainer that pauses generation for it names
#: its timer.
_SYNC_TIMERS = ("timing_s/update_weights", "timing_s/param_sync", "timing_s/sync_rollout_weights")


def weight_sync_pause_is_true(flag: dict[str, Any], metrics: dict[int, dict[str, Any]]) -> str:
    """weight_sync_pause is true of a step range when the trainer's own sync timer is at least
    the flag's share of the step there: over the flagged steps, the median of the sync timer
    over ``timing_s/step`` at least 0.3 for a critical flag, 0.15 for a warning (the
    detector's bars, defaults.yaml). The whole timer is a pause: verl's
    ``CheckpointEngineManager.update_weights`` aborts every rollout replica's requests before
    it syncs and resumes them after (verl/checkpoint_engine/base.py, verl 0.9). On the V1
    separate-async run: 0.43. Returns what is wrong, or ''."""
    first, last = flag["scope"]["steps"]
    shares = []
    for n in range(first, last + 1):
        m = metrics.get(n, {})
        timer = next((k for k in _SYNC_TIMERS if k in m), None)
        if timer is not None and (share := _ratio(m, timer, "timing_s/step")) is not None:
            shares.append(share)
    if not shares:
        return "no weight-sync timer in the flagged steps"
    share, bar = statistics.median(shares), 0.3 if flag["severity"] == "critical" else 0.15
    return "" if share >= bar else f"the sync is {share:.0%} of the step (bar {bar:.0%})"


#: Warnings that real healthy runs raise and that are true of them: kind -> the check, on the
#: log's own numbers, that makes the flag true (it returns what is wrong, or '').
TRUE_OBSERVATIONS: dict[str, Callable[[dict[str, Any], dict[int, dict[str, Any]]], str]] = {
    "rollout_long_tail": long_tail_is_true,
    "weight_sync_pause": weight_sync_pause_is_true,
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
