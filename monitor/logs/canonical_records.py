"""Turn verl log lines (console or file-logger JSONL, any version) into canonical records.

``LogParser`` is fed one physical line at a time (live, by the exporter) and returns the
``StepRecord`` and ``Event`` objects that line completes. ``parse_file`` streams a whole file
through it (for ``analyze``) and fills in end times. Nothing here raises on bad input: lines
that look like steps but cannot be read are counted and sampled in ``ParseStats``.

Times: a leading timestamp on a line (ISO 8601, ``[YYYY-MM-DD HH:MM:SS]`` or
``YYYY-MM-DD HH:MM:SS,mmm``; naive times are UTC) is the step's end time; otherwise the
``arrival_time`` given to ``feed``; ``parse_file`` rebuilds the rest from the step totals.

This module is the public face of the parser; the work is split by what is parsed:

- ``prefix``: what wraps a line (timestamp, Ray prefix, ANSI colours, tqdm redraws);
- ``console``: ``step:N - key:value`` lines and ``Step N: name=12ms`` breakdowns;
- ``jsonl``: the file logger's JSON objects, merged per step;
- ``blocks``: validation pprint blocks, tracebacks, HybridEngine switches;
- ``events``: single-line events (progress, weight sync, memory, failures);
- ``vocabulary``: the keys and number format, and the verl version they suggest;
- ``parser``: ``LogParser``, which hands each line to the right one;
- ``files``: ``parse_file``, whole files and their end times.
"""

from __future__ import annotations

from monitor.logs.files import parse_file
from monitor.logs.parser import LogParser
from monitor.logs.stats import (
    MAX_ERROR_SAMPLES,
    MAX_STEP,
    SAMPLE_CHARS,
    Item,
    LogReadError,
    ParsedLog,
    ParseStats,
)

__all__ = [
    "MAX_ERROR_SAMPLES",
    "MAX_STEP",
    "SAMPLE_CHARS",
    "Item",
    "LogParser",
    "LogReadError",
    "ParseStats",
    "ParsedLog",
    "parse_file",
]
