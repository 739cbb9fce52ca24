"""When each attempt of a job started and ended: ``<log>.attempts`` beside the job's log.

A job that crashes or hangs is started again (Slurm ``--requeue``, Ray job retries, a
Kubernetes restart policy, a person); verl then resumes from its last checkpoint
(``trainer.resume_mode=auto``). Each start under ``verl-monitor run`` is one *attempt*: ``run``
appends one JSON line when it starts the command and one when the command exits::

    {"event": "start", "time": 1796165380.29, "pid": 4403, "offset": 58372, "host": "gpu-01"}
    {"event": "end", "time": 1796165573.81, "status": 143}

``offset`` is where the attempt's output starts in the log (the log is appended to). The
exporter and ``analyze`` read these lines as ``attempt_start`` / ``attempt_end`` events
(:func:`read_marks`); the attempt ledger (``monitor.analysis.attempts``) splits the job there.
Without the file (a log written by anything else, several logs of one job), each log file is
one attempt, from its first line to its last (:func:`file_marks`), and a resume line inside a
file starts another (``monitor.analysis.attempts``).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path

from monitor.logs.safe_read import Unreadable, note, open_beside
from monitor.numbers import int_or_none
from monitor.records import Event, StepRecord

SUFFIX = ".attempts"
START, END = "attempt_start", "attempt_end"
#: Lines of the file read at most (one job restarted this often is read whole).
MAX_LINES = 100_000
#: Bytes of the file read at most (MAX_LINES records of about 100 bytes).
MAX_BYTES = 16 * 2**20


def marks_path(log_path: str | os.PathLike[str]) -> Path:
    """``<log>.attempts`` beside ``log_path``."""
    p = Path(log_path)
    return p.with_name(p.name + SUFFIX)


def _append(log_path: str | os.PathLike[str], record: dict) -> None:
    """Append one record (best effort: a full disk costs the job nothing)."""
    try:
        with open(marks_path(log_path), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError:
        pass


def record_start(log_path: str | os.PathLike[str], pid: int, offset: int,
                 when: float | None = None) -> None:
    """Say that an attempt started: the command's ``pid``, where its output starts in the log."""
    _append(log_path, {"event": "start", "time": time.time() if when is None else when,
                       "pid": int(pid), "offset": int(offset), "host": socket.gethostname()})


def record_end(log_path: str | os.PathLike[str], status: int, when: float | None = None) -> None:
    """Say that the attempt's command exited with ``status`` (128 + N: ended by signal N)."""
    _append(log_path, {"event": "end", "time": time.time() if when is None else when,
                       "status": int(status)})


def read_marks(log_path: str | os.PathLike[str]) -> list[Event]:
    """The ``attempt_start`` / ``attempt_end`` events of ``<log>.attempts`` in file order
    (none when there is no such file). A line that is not a whole record (torn by a kill) is
    skipped; ``data["source"]`` is ``"run"``."""
    path = marks_path(log_path)
    try:  # read like the log (monitor.logs.safe_read): a FIFO or a device is not waited on
        with open_beside(path, os.path.dirname(os.path.abspath(path))) as fh:
            raw = fh.read(MAX_BYTES)
    except Unreadable as exc:
        if os.path.lexists(path):
            note(exc, log_path)
        return []
    except OSError:
        return []
    lines = raw.decode("utf-8", "replace").split("\n")[:MAX_LINES]
    out: list[Event] = []
    for line in lines:
        try:
            rec = json.loads(line)
            when = float(rec["time"])
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(rec, dict) or not math.isfinite(when):
            continue
        if rec.get("event") == "start":
            data = {"source": "run", "pid": int_or_none(rec.get("pid")),
                    "offset": int_or_none(rec.get("offset")), "host": str(rec.get("host") or "")}
            out.append(Event(START, when, None, "the job started (verl-monitor run)", data))
        elif rec.get("event") == "end":
            status = int_or_none(rec.get("status"))
            out.append(Event(END, when, None, f"the job exited with status {status}",
                             {"source": "run", "status": status}))
    return out


def file_marks(path: str | os.PathLike[str], steps: list[StepRecord], events: list[Event],
               first_line: float | None = None) -> list[Event]:
    """One attempt for one log file of a job: an ``attempt_start`` at its first line's time
    (``first_line``, e.g. its first capture time) or else its first step's start or event,
    and an ``attempt_end`` (status unknown) at its last step or event. None without times."""
    starts = [float(s.end_time) - float(s.total or 0.0) for s in steps if s.end_time is not None]
    times = [float(e.time) for e in events if e.time is not None]
    ends = [float(s.end_time) for s in steps if s.end_time is not None] + times
    if not ends:
        return []
    first = first_line if first_line is not None else min(starts + times)
    data = {"source": "file", "path": str(path)}
    return [Event(START, first, None, f"{Path(path).name}: its first line", dict(data)),
            Event(END, max(ends), None, f"{Path(path).name}: its last line",
                  {**data, "status": None})]


def first_line_time(path: str | os.PathLike[str], max_lines: int = 2000) -> float | None:
    """When the log's first line was written: its first capture time (``.arrivals``, written
    by ``verl-monitor run``), else the first timestamp on one of its first lines; None."""
    from monitor.logs.arrivals import capture_times
    from monitor.logs.timestamps import split_timestamp

    times = capture_times(path)  # streamed and checked: only its first usable record is read
    if times is not None:
        with times:
            first = next((r.ts for r in times.records() if r.ts is not None), None)
        if first is not None:
            return first
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh):
                when, _ = split_timestamp(line)
                if when is not None or n >= max_lines:
                    return when
    except OSError:
        return None
    return None
