"""Several logs of one job as one record: ``verl-monitor analyze attempt1.log attempt2.log``.

Each log's steps and events are kept as they are; each log brings its attempts' starts and
exits: those ``verl-monitor run`` wrote beside it (``<log>.attempts``), else one attempt
from its first line (its first capture time or timestamp, else its first step or event) to its last
(``monitor.logs.attempt_marks.file_marks``). The attempt ledger
(``monitor.analysis.attempts``) then books the job across them.
"""

from __future__ import annotations

from collections.abc import Iterable

from monitor.logs.attempt_marks import END, START, file_marks, first_line_time, read_marks
from monitor.logs.stats import ParsedLog
from monitor.records import Event, StepRecord


def log_marks(path: str, parsed: ParsedLog) -> list[Event]:
    """The attempt marks of one log: its ``.attempts`` file, else the log as one attempt."""
    return read_marks(path) or file_marks(path, parsed.steps, parsed.events,
                                          first_line_time(path))


def prefer_run_marks(events: list[Event], slack_s: float = 1.0) -> list[Event]:
    """``events`` without the marks that make a log one attempt (``file_marks``) where marks
    ``verl-monitor run`` recorded cover that log's time (given with ``--events``: the
    exported store of the run that wrote it; a ``train.jsonl`` from ``verl-monitor export``
    has no ``.attempts`` beside it). Both would otherwise count, and split the job twice. A
    run attempt without a recorded end lasts until the next one's start (the last: on)."""
    runs: list[list[float]] = []  # [start, end] of each run attempt (an open one: no end)
    files: dict[str, list[float]] = {}
    for e in sorted((e for e in events if e.kind in (START, END) and e.time is not None),
                    key=lambda e: float(e.time)):
        source = (e.data or {}).get("source")
        if source == "run" and e.kind == START:
            if runs and runs[-1][1] == float("inf"):  # no end recorded: ended by this start
                runs[-1][1] = float(e.time)
            runs.append([float(e.time), float("inf")])
        elif source == "run" and runs and runs[-1][1] == float("inf"):
            runs[-1][1] = float(e.time)
        elif source == "file":
            files.setdefault(str((e.data or {}).get("path")), []).append(float(e.time))
    covered = {path for path, times in files.items()
               if any(lo <= max(times) + slack_s and min(times) - slack_s <= hi
                      for lo, hi in runs)}
    if not covered:
        return events
    return [e for e in events if not (e.kind in (START, END)
                                      and (e.data or {}).get("source") == "file"
                                      and str((e.data or {}).get("path")) in covered)]


def join_logs(logs: Iterable[tuple[str, ParsedLog]]) -> tuple[list[StepRecord], list[Event]]:
    """The steps and events of every log, with each log's attempt marks, in time order."""
    steps: list[StepRecord] = []
    events: list[Event] = []
    for path, parsed in logs:
        steps += parsed.steps
        events += parsed.events + log_marks(str(path), parsed)
    steps.sort(key=lambda s: (s.end_time is None, s.end_time or 0.0))
    events.sort(key=lambda e: (e.time is None, e.time or 0.0))
    return steps, events
