"""Turn verl log lines (console or file-logger JSONL, any version) into canonical records.

``LogParser`` is fed one physical line at a time (live, by the exporter) and returns the
``StepRecord`` and ``Event`` objects that line completes. ``parse_file`` streams a whole file
through it (for ``analyze``) and fills in end times. Nothing here raises on bad input: lines
that look like steps but cannot be read are counted and sampled in ``ParseStats``.

Times: a leading timestamp on a line (ISO 8601, ``[YYYY-MM-DD HH:MM:SS]`` or
``YYYY-MM-DD HH:MM:SS,mmm``; naive times are UTC) is the step's end time; otherwise the
``arrival_time`` given to ``feed``; ``parse_file`` rebuilds the rest from the step totals.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.logs.failures import is_oom, match_failure, oom_details, traceback_phase
from monitor.logs.follow import iter_lines
from monitor.logs.keys import guess_version, other_seconds, phases_and_total
from monitor.logs.timestamps import parse_timestamp, split_timestamp
from monitor.logs.values import json_number, to_number, value_format
from monitor.records import ALL_PHASES, Event, StepRecord

Item = StepRecord | Event

#: How many unparseable lines ``ParseStats.error_samples`` keeps, and how long each may be.
MAX_ERROR_SAMPLES = 20
SAMPLE_CHARS = 200
#: Step lines used to learn the number format (3-decimal / repr / numpy).
_FORMAT_VOTES = 5
_GIB = float(2**30)

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX_RE = re.compile(r"\((?:([A-Za-z_][\w.:-]*) )?pid=(\d+)(?:, ip=([0-9A-Fa-f.:]+))?\) ?")
_REPEATED_RE = re.compile(r"\s*\[repeated (\d+)x across cluster\]\s*$")
_STEP_ANYWHERE_RE = re.compile(r"(?<![\w/.-])step:")
_TQDM_RE = re.compile(
    r"Training Progress:\s*(\d+)%\|[^|]*\|\s*(\d+)/(\d+)\s*\[([\d:]+|\?)<([\d:]+|\?),"
    r"\s*(?:([\d.]+|\?)(s/it|it/s))?"
)
_SET_STEP_RE = re.compile(r"Setting global step to (\d+)")
_LOAD_CKPT_RE = re.compile(r"Load from checkpoint folder:\s*(.*?)\s*$")
_SYNC_RE = re.compile(
    r"sync_weights success\.? cost ([-+\d.eE]+) seconds?(?:, pause:\s*([-+\d.eE]+) ?s)?"
    r"(?:, sync:\s*([-+\d.eE]+) ?s)?"
)
_BREAKDOWN_RE = re.compile(r"Step (\d+):\s*(.*)$")
_BREAKDOWN_FIELD_RE = re.compile(
    r"([A-Za-z_][\w/.-]*)\s*=\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(ms|us|µs|s|sec)?"
)
_MEMORY_RE = re.compile(
    r"(?P<head>[^,]*?),\s*memory allocated \(GB\):\s*(?P<a>[-\d.eE+naif]+),\s*"
    r"memory reserved \(GB\):\s*(?P<r>[-\d.eE+naif]+)"
    r"(?:,\s*device memory used/total \(GB\):\s*(?P<u>[-\d.eE+naif]+)/(?P<t>[-\d.eE+naif]+))?"
)
_MEMORY_HEAD_RE = re.compile(r"(?:.*[\s:\]])?(\S+) (Before|After) (.+)$")
_PPRINT_PAIR_RE = re.compile(r"['\"]([^'\"]+)['\"]\s*:\s*((?:np\.\w+\()?[-+\w.]+\)?)")
_VALIDATION_START = ("Initial validation metrics:", "Final validation metrics:")
_BREAKDOWN_NAMES = {
    "total": None,
    "actor_gen": "gen",
    "critic_score": "values",
    "loss_comp": "update_actor",
    "rollout_wait": "rollout_wait",
    "comm": "comm",
}
_UNIT_SECONDS = {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "s": 1.0, "sec": 1.0, None: 1e-3}
_TRACEBACK_START = "Traceback (most recent call last):"
#: The largest step number a record may carry (the store keeps steps as signed 64-bit integers).
MAX_STEP = 2**63 - 1
#: Failure lines remembered for de-duplication until the next step record.
_MAX_FAILURE_SIGNATURES = 512
_CHAIN_MARKERS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)


class LogReadError(OSError):
    """A log file that cannot be read; the message is one line naming the file."""


@dataclass
class ParseStats:
    """Counters of one parser. ``bad_utf8_lines``: lines holding U+FFFD, the mark the reader
    (``iter_lines``, ``LogFollower``) leaves where it replaced invalid UTF-8. ``oversize_lines``:
    lines ``parse_file``'s reader dropped for being longer than its limit.
    ``noise_lines`` are ordinary lines that are neither records nor events. ``error_samples`` holds the last unparseable lines, each cut to
    200 characters and prefixed with the reason (``"bad value for 'actor/lr': ..."``)."""

    lines: int = 0
    records: int = 0
    events: int = 0
    parse_errors: int = 0
    bad_utf8_lines: int = 0
    noise_lines: int = 0
    oversize_lines: int = 0
    error_samples: list[str] = field(default_factory=list)

    def add_error(self, reason: str, line: str) -> None:
        """Count one unparseable line and keep a short sample of it."""
        self.parse_errors += 1
        self.error_samples.append(f"{reason}: {line[:SAMPLE_CHARS]}")
        if len(self.error_samples) > MAX_ERROR_SAMPLES:
            del self.error_samples[:-MAX_ERROR_SAMPLES]


@dataclass
class ParsedLog:
    """A whole parsed log file. ``format`` is ``"console"`` or ``"jsonl"`` (``"empty"`` when
    the file holds no text)."""

    steps: list[StepRecord]
    events: list[Event]
    version_guess: str
    stats: ParseStats
    format: str


@dataclass
class _Block:
    """A multi-line construct in progress (validation pprint, traceback, HybridEngine switch)."""

    kind: str
    time: float | None
    lines: list[str] = field(default_factory=list)
    last_time: float | None = None
    exception: str | None = None
    awaiting_chain: bool = False
    chained: int = 0


@dataclass
class _PendingJson:
    step: int
    metrics: dict[str, Any]
    end_time: float | None
    time_source: str


class LogParser:
    """Incremental parser of one verl log (console lines and/or file-logger JSONL lines).

    ``feed`` takes one physical line and returns what it completed; multi-line blocks
    (validation pprint, tracebacks, HybridEngine switches) and JSONL objects that may be merged
    with a following object of the same step are held until a later line or ``flush``. A live
    reader should call ``flush`` when the file has gone quiet (a poll returned no lines).
    ``source`` names the log in error samples.
    """

    def __init__(self, source: str = "log") -> None:
        self.source = source
        self.stats = ParseStats()
        self._keys: set[str] = set()
        self._prefixes: set[str] = set()
        self._format_votes: dict[str, int] = {}
        self._format_lines = 0
        self._number_format: str | None = None
        self._version_cache: tuple[int, int, str | None, str] | None = None
        self._block: _Block | None = None
        self._switch: _Block | None = None
        self._json: _PendingJson | None = None
        self._json_done: dict[str, Any] | None = None  # last flushed JSONL object, for merging
        self._json_done_step: int | None = None
        self._pending_reshard: float | None = None
        self._last_step: int | None = None
        self._resume_since_step = False
        self._last_oom: str | None = None
        self._last_keys: list[str] = []
        self._failures_seen: set[tuple[Any, ...]] = set()
        self._line_ip: str | None = None
        #: (step, metrics) of a validation-only line, merged into a following record of that step
        self._pending_val: tuple[int, dict[str, Any]] | None = None

    # --- public -------------------------------------------------------------------------------

    @property
    def version_guess(self) -> str:
        """The verl version range this log looks like (see ``keys.guess_version``)."""
        key = (len(self._keys), len(self._prefixes), self._number_format)
        cached = self._version_cache
        if cached is not None and cached[:3] == key:
            return cached[3]
        guess = guess_version(self._keys, self._prefixes, number_format=self._number_format)
        self._version_cache = (*key, guess)
        return guess

    def feed(self, line: str, arrival_time: float | None = None) -> list[Item]:
        """Parse one physical line (with or without its newline). Never raises."""
        self.stats.lines += 1
        out: list[Item] = []
        try:
            self._feed(line, arrival_time, out)
        except Exception as exc:  # noqa: BLE001 - the parser must survive any line
            self.stats.add_error(f"internal error {exc.__class__.__name__}", line)
        self._count(out)
        return out

    def flush(self, arrival_time: float | None = None) -> list[Item]:
        """End pending multi-line blocks and merged JSONL objects; return what they make."""
        out: list[Item] = []
        try:
            self._close_block(out)
            self._close_switch(out)
            self._close_json(out)
        except Exception as exc:  # noqa: BLE001
            self.stats.add_error(f"internal error {exc.__class__.__name__}", "<flush>")
        self._count(out)
        return out

    # --- line dispatch ------------------------------------------------------------------------

    def _count(self, out: list[Item]) -> None:
        for item in out:
            if isinstance(item, StepRecord):
                self.stats.records += 1
            else:
                self.stats.events += 1

    def _feed(self, line: str, arrival: float | None, out: list[Item]) -> None:
        if line.endswith("\n"):
            line = line[:-1]
        if "\ufffd" in line:
            # the reader replaced invalid UTF-8 (free to test on ASCII/latin-1 text)
            self.stats.bad_utf8_lines += 1
        if "\r" in line:
            # tqdm redraws with carriage returns: the last drawing is the current one.
            parts = [p for p in line.split("\r") if p.strip()]
            line = parts[-1] if parts else ""
        if "\x1b" in line:
            line = _ANSI_RE.sub("", line)
        ts, text = split_timestamp(line)
        self._line_ip = None
        if text.startswith("("):
            match = _RAY_PREFIX_RE.match(text)
            if match is not None:
                if match.group(1):
                    self._prefixes.add(match.group(1))
                self._line_ip = match.group(3)
                text = text[match.end() :]
                if ts is None:
                    ts, text = split_timestamp(text)
        repeated = 1
        if text.endswith("cluster]"):
            match = _REPEATED_RE.search(text)
            if match is not None:
                repeated = int(match.group(1))
                text = text[: match.start()]
        when = ts if ts is not None else arrival

        if self._block is not None and self._continue_block(text, when, out):
            return
        if self._switch is not None and "[HybridEngine]" not in text and not text.isspace():
            self._close_switch(out)

        if text.startswith("step:"):
            self._step_line(text[5:], ts, arrival, line, out)
            return
        stripped = text.strip()
        if not stripped:
            return
        first = stripped[0]
        if first == "{":
            self._json_line(stripped, arrival, line, out)
            return
        before = len(out)
        if self._other_line(stripped, text, ts, when, repeated, line, out):
            if repeated > 1:
                for item in out[before:]:
                    if isinstance(item, Event):
                        item.data["repeated"] = repeated
            return
        match = _STEP_ANYWHERE_RE.search(text)
        if match is not None and " - " in text[match.end() :]:
            self._step_line(text[match.end() :], ts, arrival, line, out)
            return
        self.stats.noise_lines += 1

    def _other_line(
        self,
        stripped: str,
        text: str,
        ts: float | None,
        when: float | None,
        repeated: int,
        line: str,
        out: list[Item],
    ) -> bool:
        """Every single-line event and block start. True when the line was used."""
        if "Training Progress" in stripped:
            return self._progress(stripped, when, out)
        if "validation metrics:" in stripped and any(s in stripped for s in _VALIDATION_START):
            self._start_validation(stripped, when, out)
            return True
        if stripped.startswith("Step ") and "=" in stripped:
            match = _BREAKDOWN_RE.match(stripped)
            if match is not None:
                self._breakdown(match, ts, when, line, out)
                return True
        used = False
        if is_oom(stripped):
            self._oom(stripped, when, out)
            used = True
        elif self._failure(stripped, when, out):
            return True
        if _TRACEBACK_START in stripped:
            self._close_block(out)
            self._block = _Block("traceback", when, [stripped])
            return True
        if "[HybridEngine]" in stripped:
            self._hybrid(stripped, when, out)
            return True
        if "sync_weights success" in stripped:
            self._param_sync(stripped, when, line, out)
            return True
        if "Setting global step to" in stripped:
            match = _SET_STEP_RE.search(stripped)
            if match is not None:
                step = int(match.group(1))
                out.append(Event("resume", when, step, stripped, {"reason": "setting_global_step"}))
                self._resume_since_step = True
                return True
        if "Load from checkpoint folder" in stripped:
            match = _LOAD_CKPT_RE.search(stripped)
            path = match.group(1) if match else ""
            out.append(Event("checkpoint_load", when, self._last_step, stripped, {"path": path}))
            return True
        if "memory allocated (GB)" in stripped:
            return self._memory(stripped, when, out) or used
        return used

    # --- console step lines ---------------------------------------------------------------------

    def _step_line(
        self, body: str, ts: float | None, arrival: float | None, line: str, out: list[Item]
    ) -> None:
        body = body.rstrip()
        numpy_values = "np." in body
        if numpy_values:
            body = _unwrap_numpy(body)  # np.float64(0.5) -> 0.5
        # Fast path: "N - k1:v1 - k2:v2" -> "N:k1:v1:k2:v2" -> one split, all in C.
        flat = body.replace(" - ", ":").split(":")
        step_text = flat[0].strip()
        try:
            step = int(step_text)
        except ValueError:
            num = to_number(step_text)
            if num is None or isinstance(num, bool) or not math.isfinite(num):
                self.stats.add_error("bad step number", line)
                return
            step = int(num)
        if not 0 <= step <= MAX_STEP:
            self.stats.add_error(f"step number {_short_number(step)} outside 0..2**63-1", line)
            return
        keys = flat[1::2]
        same_keys = keys == self._last_keys
        if same_keys:
            keys = self._last_keys  # share the key strings between records (memory)
        else:
            self._last_keys = keys
        metrics = _fast_fields(flat, keys)
        bad: str | None = None
        if metrics is None:
            metrics, bad = _careful_fields(body.split(" - ")[1:])
        if self._format_lines < _FORMAT_VOTES:
            self._vote_format(body, numpy_values)
        if bad is not None:
            self.stats.add_error(bad, line)
            if not metrics:
                return
        if ts is not None:
            end_time, source = ts, "line"
        else:
            end_time, source = arrival, "arrival"
        self._emit_metrics(
            step, metrics, end_time, source, "console", out, known_keys=same_keys and not bad
        )

    def _vote_format(self, body: str, numpy_values: bool) -> None:
        if numpy_values:
            fmt: str | None = "numpy"
        else:
            fmt = value_format([p.partition(":")[2].strip() for p in body.split(" - ")[1:]])
        if fmt is None:
            return
        self._format_lines += 1
        self._format_votes[fmt] = self._format_votes.get(fmt, 0) + 1
        if "numpy" in self._format_votes:
            self._number_format = "numpy"
        else:
            self._number_format = max(self._format_votes, key=self._format_votes.__getitem__)

    def _emit_metrics(
        self,
        step: int,
        metrics: dict[str, Any],
        end_time: float | None,
        time_source: str,
        source: str,
        out: list[Item],
        *,
        known_keys: bool = False,
    ) -> None:
        """A validation event for validation-only metrics, else a step record.
        ``known_keys``: the keys are those of the previous step line (already recorded)."""
        if metrics and _validation_only(metrics):
            out.append(
                Event("validation", end_time, step, "", {"metrics": metrics, "origin": "step"})
            )
            self._pending_val = (step, metrics)
            return
        if not known_keys:
            self._keys.update(metrics)
        if self._last_step is not None and step < self._last_step and not self._resume_since_step:
            out.append(
                Event(
                    "resume",
                    end_time,
                    step,
                    f"step went back from {self._last_step} to {step}",
                    {"reason": "step_backwards", "from_step": self._last_step},
                )
            )
        out.append(self._record(step, metrics, end_time, time_source, source))

    def _record(
        self,
        step: int,
        metrics: dict[str, Any],
        end_time: float | None,
        time_source: str,
        source: str,
    ) -> StepRecord:
        hint = "<=0.4.1" if self._number_format == "3dec" or "main_task" in self._prefixes else None
        pending_val = self._pending_val
        if pending_val is not None:
            self._pending_val = None
            if pending_val[0] == step:
                # validation printed just before the training line of the same step: one step
                metrics = {**pending_val[1], **metrics}
        phases, total = phases_and_total(metrics, version_hint=hint)
        record = StepRecord(
            step=step,
            end_time=end_time,
            total=total,
            phases=phases,
            throughput=_finite(metrics.get("perf/throughput")),
            mem_allocated_peak_bytes=_gib_bytes(metrics, "max_memory_allocated_gb"),
            mem_reserved_peak_bytes=_gib_bytes(metrics, "max_memory_reserved_gb"),
            metrics=metrics,
            time_source=time_source,
            source=source,
        )
        self._apply_pending_reshard(record, old_era=hint is not None)
        self._last_step = step
        self._resume_since_step = False
        self._last_oom = None
        self._failures_seen.clear()
        return record

    def _apply_pending_reshard(self, record: StepRecord, *, old_era: bool = False) -> None:
        if self._pending_reshard is None or "reshard" in record.phases:
            return
        record.phases["reshard"] = self._pending_reshard
        self._pending_reshard = None
        if record.total is not None:
            record.phases["other"] = other_seconds(
                record.total, record.phases, include_outside_step=old_era
            )

    # --- JSONL ----------------------------------------------------------------------------------

    def _json_line(self, text: str, arrival: float | None, line: str, out: list[Item]) -> None:
        try:
            obj = json.loads(text)
        except ValueError:
            if '"step"' in text:
                self.stats.add_error("bad JSON", line)
            else:
                self.stats.noise_lines += 1
            return
        if not isinstance(obj, dict) or "step" not in obj:
            self.stats.noise_lines += 1
            return
        step_val = obj.get("step")
        if isinstance(step_val, bool) or not isinstance(step_val, (int, float)):
            self.stats.add_error("JSON step is not a number", line)
            return
        if isinstance(step_val, float) and not math.isfinite(step_val):
            self.stats.add_error("JSON step is not finite", line)
            return
        step = int(step_val)
        if not 0 <= step <= MAX_STEP:
            self.stats.add_error(f"JSON step {_short_number(step)} outside 0..2**63-1", line)
            return
        data = obj.get("data", {})
        if not isinstance(data, dict):
            self.stats.add_error("JSON data is not an object", line)
            return
        metrics: dict[str, Any] = {}
        for key, value in data.items():
            num = json_number(value)
            if num is not None:
                metrics[str(key)] = num
        end_time, time_source = _json_time(obj)
        if end_time is None:
            end_time, time_source = arrival, "arrival"

        pending = self._json
        if pending is not None and pending.step == step:
            pending.metrics.update(metrics)
            if end_time is not None:
                pending.end_time, pending.time_source = end_time, time_source
            return
        if metrics and _validation_only(metrics):
            out.append(
                Event("validation", end_time, step, "", {"metrics": metrics, "origin": "jsonl"})
            )
            self._pending_val = (step, metrics)
            return
        self._close_json(out)
        if self._json_done is not None and self._json_done_step == step:
            # A late object of a step already flushed: re-emit the step, merged (an update).
            merged = dict(self._json_done)
            merged.update(metrics)
            metrics = merged
        self._json = _PendingJson(step, metrics, end_time, time_source)

    def _close_json(self, out: list[Item]) -> None:
        pending = self._json
        if pending is None:
            return
        self._json = None
        self._json_done = pending.metrics
        self._json_done_step = pending.step
        self._emit_metrics(
            pending.step, pending.metrics, pending.end_time, pending.time_source, "jsonl", out
        )

    # --- single-line events ---------------------------------------------------------------------

    def _progress(self, text: str, when: float | None, out: list[Item]) -> bool:
        match = _TQDM_RE.search(text)
        if match is None:
            self.stats.noise_lines += 1
            return True
        pct, cur, tot, elapsed, eta, rate, unit = match.groups()
        s_per_it: float | None = None
        if rate not in (None, "?"):
            try:
                rate_val = float(rate)
            except ValueError:
                rate_val = 0.0
            if unit == "s/it":
                s_per_it = rate_val
            elif rate_val > 0:
                s_per_it = 1.0 / rate_val
        data = {
            "current": int(cur),
            "total": int(tot),
            "percent": int(pct),
            "elapsed_s": _clock_seconds(elapsed),
            "eta_s": _clock_seconds(eta),
            "s_per_it": s_per_it,
        }
        out.append(Event("progress", when, int(cur), text, data))
        return True

    def _oom(
        self, text: str, when: float | None, out: list[Item], frames: list[str] | None = None
    ) -> None:
        """An ``oom`` event: sizes from the message, the phase from the traceback's frames."""
        if text == self._last_oom:
            return
        self._last_oom = text
        data: dict[str, Any] = oom_details(text)
        if frames:
            named = traceback_phase(frames)
            if named is not None:
                data["function"], data["phase"] = named
        if self._line_ip:
            data["ip"] = self._line_ip
        out.append(Event("oom", when, self._last_step, text, data))

    def _failure(self, text: str, when: float | None, out: list[Item]) -> bool:
        """A failure event (NCCL timeout or error, Ray actor death, killed worker, CUDA error)
        for a line that reports one; the same failure printed again is used but not repeated."""
        found = match_failure(text)
        if found is None:
            return False
        if found.signature in self._failures_seen:
            return True
        if len(self._failures_seen) >= _MAX_FAILURE_SIGNATURES:
            self._failures_seen.clear()
        self._failures_seen.add(found.signature)
        data = found.data
        if self._line_ip:
            data["ip"] = self._line_ip
        out.append(Event(found.kind, when, self._last_step, text[:SAMPLE_CHARS * 2], data))
        return True

    def _param_sync(self, text: str, when: float | None, line: str, out: list[Item]) -> None:
        match = _SYNC_RE.search(text)
        if match is None:
            self.stats.add_error("unreadable sync_weights line", line)
            return
        seconds = _float_or_none(match.group(1))
        data = {
            "seconds": seconds,
            "pause_s": _float_or_none(match.group(2)),
            "sync_s": _float_or_none(match.group(3)),
            "source": "parameter_synchronizer",
        }
        out.append(Event("reshard", when, self._last_step, text, data))
        if seconds is not None and math.isfinite(seconds) and seconds >= 0:
            self._pending_reshard = seconds

    def _memory(self, text: str, when: float | None, out: list[Item]) -> bool:
        match = _MEMORY_RE.search(text)
        if match is None:
            return False
        head = match.group("head").strip()
        data: dict[str, Any] = {
            "allocated_gb": _float_or_none(match.group("a")),
            "reserved_gb": _float_or_none(match.group("r")),
            "device_used_gb": _float_or_none(match.group("u")),
            "device_total_gb": _float_or_none(match.group("t")),
            "label": head,
        }
        head_match = _MEMORY_HEAD_RE.match(head)
        if head_match is not None:
            data["role"], data["when"], data["fn"] = head_match.groups()
        out.append(Event("memory", when, self._last_step, text, data))
        return True

    def _breakdown(
        self, match: re.Match[str], ts: float | None, when: float | None, line: str, out: list[Item]
    ) -> None:
        step = int(match.group(1))
        metrics: dict[str, Any] = {}
        phases: dict[str, float] = {}
        total: float | None = None
        for field_match in _BREAKDOWN_FIELD_RE.finditer(match.group(2)):
            name, number, unit = field_match.groups()
            value = float(number)
            metrics[name] = value
            seconds = value * _UNIT_SECONDS.get(unit, 1e-3)
            if not (0.0 <= seconds < math.inf):
                continue
            if name == "total":
                total = seconds
                continue
            phase = _BREAKDOWN_NAMES.get(name)
            if phase is None and name in ALL_PHASES:
                phase = name
            if phase is not None:
                phases[phase] = phases.get(phase, 0.0) + seconds
        if not metrics:
            self.stats.add_error("breakdown line without fields", line)
            return
        if total is not None:
            phases["other"] = other_seconds(total, phases, include_outside_step=True)
        record = StepRecord(
            step=step,
            end_time=when,
            total=total,
            phases=phases,
            metrics=metrics,
            time_source="line" if ts is not None else "arrival",
            source="breakdown",
        )
        self._apply_pending_reshard(record, old_era=True)
        self._keys.update(metrics)
        self._last_step = step
        self._resume_since_step = False
        out.append(record)

    # --- multi-line blocks ----------------------------------------------------------------------

    def _hybrid(self, text: str, when: float | None, out: list[Item]) -> None:
        switch = self._switch
        if switch is not None and "Resharding" in text:
            self._close_switch(out)
            switch = None
        if switch is None:
            self._switch = _Block("hybrid", when, [text], last_time=when)
            return
        switch.lines.append(text)
        if when is not None:
            switch.last_time = when

    def _close_switch(self, out: list[Item]) -> None:
        switch = self._switch
        if switch is None:
            return
        self._switch = None
        seconds: float | None = None
        if switch.time is not None and switch.last_time is not None and len(switch.lines) > 1:
            seconds = max(0.0, switch.last_time - switch.time)
        data = {"seconds": seconds, "source": "hybrid_engine", "lines": len(switch.lines)}
        out.append(Event("reshard", switch.time, self._last_step, switch.lines[0], data))
        if seconds is not None:
            self._pending_reshard = seconds

    def _start_validation(self, text: str, when: float | None, out: list[Item]) -> None:
        self._close_block(out)
        block = _Block("validation", when, [text])
        self._block = block
        if _validation_complete(text, first=True):
            self._close_block(out)

    def _continue_block(self, text: str, when: float | None, out: list[Item]) -> bool:
        """Feed a line to the open block; False when the line is not part of it (the block is
        then closed and the caller handles the line normally)."""
        block = self._block
        assert block is not None
        if block.kind == "validation":
            continues = text.startswith(" ") or (len(block.lines) == 1 and text.startswith("{"))
            if continues and not text.lstrip().startswith("step:") and len(block.lines) < 10000:
                block.lines.append(text)
                if _validation_complete(text, first=False):
                    self._close_block(out)
                return True
            self._close_block(out)
            return False
        # traceback
        stripped = text.strip()
        if block.awaiting_chain:
            if not stripped:
                return True
            if stripped.startswith(_CHAIN_MARKERS) or stripped.startswith(_TRACEBACK_START):
                block.awaiting_chain = False
                block.chained += 1
                block.lines.append(stripped)
                return True
            if text[0].isspace() and len(block.lines) < 10000:
                if stripped.startswith('File "'):
                    # Ray re-raises a worker's exception with the worker's own frames after it
                    # (RayTaskError(X): ray::...): the traceback goes on to the root cause.
                    block.awaiting_chain = False
                    block.chained += 1
                    block.lines.append(text)
                    return True
                if text[0] == "\t":  # Ray's detail lines (class_name:, pid:, ip:)
                    block.lines.append(text)
                    return True
            self._close_block(out)
            return False
        if text.startswith("step:") or len(block.lines) > 10000:
            self._close_block(out)
            return False
        if not stripped or text[0].isspace() or stripped.startswith(_TRACEBACK_START):
            block.lines.append(text)
            return True
        if stripped.startswith(_CHAIN_MARKERS):
            block.chained += 1
            return True
        # The first unindented line ends the traceback: the exception itself.
        block.exception = stripped
        block.lines.append(stripped)
        block.awaiting_chain = True
        if is_oom(stripped):
            self._oom(stripped, when, out, block.lines)
        else:
            self._failure(stripped, when, out)
        return True

    def _close_block(self, out: list[Item]) -> None:
        block = self._block
        if block is None:
            return
        self._block = None
        if block.kind == "validation":
            metrics = _pprint_metrics(block.lines)
            which = "final" if block.lines[0].find("Final validation") >= 0 else "initial"
            out.append(
                Event(
                    "validation",
                    block.time,
                    self._last_step,
                    block.lines[0][:SAMPLE_CHARS],
                    {"metrics": metrics, "origin": f"{which}_block"},
                )
            )
            return
        exception = block.exception or ""
        exc_type = exception.split(":", 1)[0].strip() if exception else ""
        data = {"exception": exception, "type": exc_type, "lines": len(block.lines)}
        if block.chained:
            data["chained"] = block.chained
        out.append(Event("traceback", block.time, self._last_step, exception, data))


# --- helpers ------------------------------------------------------------------------------------


def _fast_fields(flat: list[str], keys: list[str]) -> dict[str, Any] | None:
    """``{key: float}`` from ``[step, k1, v1, k2, v2, ...]`` (``keys`` is ``flat[1::2]``);
    None when any value is not a plain float (bools, numpy reprs, damage): the careful path
    then decides."""
    if len(flat) % 2 == 0:
        return None
    try:
        return dict(zip(keys, map(float, flat[2::2]), strict=True))
    except ValueError:
        return None


def _unwrap_numpy(body: str) -> str:
    """``np.float64(0.5)`` -> ``0.5`` and friends across a whole step line body."""
    body = body.replace("np.float64(", "")
    if "np." in body:
        body = (
            body.replace("np.float32(", "")
            .replace("np.float16(", "")
            .replace("np.int64(", "")
            .replace("np.int32(", "")
            .replace("np.True_", "True")
            .replace("np.False_", "False")
        )
    body = body.replace(") - ", " - ")
    return body[:-1] if body.endswith(")") else body


def _careful_fields(parts: list[str]) -> tuple[dict[str, Any], str | None]:
    """Fields one by one (bools, odd values, damage); returns (metrics, last problem)."""
    metrics: dict[str, Any] = {}
    bad: str | None = None
    for part in parts:
        key, sep, val = part.partition(":")
        if not sep or not key:
            if part.strip():
                bad = f"field without key:value {part[:40]!r}"
            continue
        try:
            metrics[key] = float(val)
        except ValueError:
            num = to_number(val)
            if num is None:
                bad = f"bad value for {key!r}"
                continue
            metrics[key] = num
    return metrics, bad


_VALIDATION_PREFIXES = ("val-core/", "val-aux/", "val/", "test_score/")


def _validation_only(metrics: dict[str, Any]) -> bool:
    """Only validation keys (``val-core/``, ``val-aux/``, ``val/``; ``test_score/`` before 0.3)."""
    for key in metrics:
        if not key.startswith(_VALIDATION_PREFIXES):
            return False
    return True


def _short_number(value: int) -> str:
    """An integer for an error message, shortened when it is very long."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def _validation_complete(text: str, *, first: bool) -> bool:
    s = text.strip()
    if first:
        if s.startswith("("):
            return s.endswith(")")
        if s[:1] in ("'", '"'):
            return len(s) > 1 and s.endswith(s[0])
        if "{" in s:
            return s.count("{") <= s.count("}")
        return False
    return s.endswith(")") or s.endswith("}") or s.endswith("}'") or s.endswith('}"')


def _pprint_metrics(lines: list[str]) -> dict[str, Any]:
    """Metric pairs from a pprint validation block (a dict, or pprint's split-string form)."""
    text = "\n".join(line.strip() for line in lines)
    if text[:1] in ("(", "'", '"'):
        try:
            value = ast.literal_eval(text)
            if isinstance(value, str):
                text = value
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
    metrics: dict[str, Any] = {}
    for key, raw in _PPRINT_PAIR_RE.findall(text):
        num = to_number(raw)
        if num is not None:
            metrics[key] = num
    return metrics


def _json_time(obj: dict[str, Any]) -> tuple[float | None, str]:
    ts = obj.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts):
        return float(ts), "line"
    stamp = obj.get("timestamp")
    if isinstance(stamp, str):
        value = parse_timestamp(stamp)
        if value is not None:
            return value, "line"
    elif isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp):
        return float(stamp), "line"
    return None, "arrival"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _gib_bytes(metrics: dict[str, Any], name: str) -> float | None:
    value = _finite(metrics.get("perf/" + name))
    if value is None:
        value = _finite(metrics.get("actor/perf/" + name))
    return None if value is None else value * _GIB


def _float_or_none(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _clock_seconds(text: str) -> float | None:
    if not text or text == "?":
        return None
    total = 0.0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return total


# --- whole files --------------------------------------------------------------------------------


def _open_error(path: Path, exc: OSError) -> LogReadError:
    if isinstance(exc, FileNotFoundError):
        reason = "no such file"
    elif isinstance(exc, IsADirectoryError):
        reason = "is a directory"
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    else:
        reason = (exc.strerror or exc.__class__.__name__).strip().splitlines()[0]
    return LogReadError(f"{path}: cannot read log ({reason})")


def _detect_format(line: str) -> str:
    text = line.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            return "console"
        if isinstance(obj, dict) and "step" in obj:
            return "jsonl"
    return "console"


def parse_file(path: str | os.PathLike[str], log_end: float | None = None) -> ParsedLog:
    """Parse a whole verl log (console or JSONL, told apart by content), streaming it.

    Step end times come from line timestamps (``time_source="line"``); the others are rebuilt
    from cumulative step totals ending at ``log_end`` (default: the file's modification time),
    ``time_source="rebuilt"``. Events without a time take the end time of the step before
    them; in a log with neither timestamps nor steps, they take ``log_end`` (their data then
    says ``time_from: "log_end"``). Raises ``LogReadError`` for a missing or unreadable file.
    """
    p = Path(path)
    try:
        mtime = os.stat(p).st_mtime
    except OSError as exc:
        raise _open_error(p, exc) from exc
    parser = LogParser(source=str(p))
    ordered: list[Item] = []
    fmt = "empty"
    first_line_seen = False
    for item in _iter_with_format(p, parser):
        if isinstance(item, str):
            if not first_line_seen:
                fmt = _detect_format(item)
                first_line_seen = True
            continue
        ordered.append(item)
    steps = [item for item in ordered if isinstance(item, StepRecord)]
    end = log_end if log_end is not None else mtime
    _rebuild_times(steps, end)
    events = _time_events(ordered, end)
    return ParsedLog(steps, events, parser.version_guess, parser.stats, fmt)


@dataclass
class _ReaderCounts:
    """What ``iter_lines`` counts; bad UTF-8 is counted by the parser itself (U+FFFD)."""

    bad_utf8_lines: int = 0
    oversize_lines: int = 0


def _iter_with_format(path: Path, parser: LogParser) -> Iterator[Item | str]:
    """Like ``iter_items`` but first yields the first non-blank line (a str) for detection."""
    seen = False
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        counts = _ReaderCounts()
        for line in iter_lines(path, stats=counts):
            if not seen and line.strip():
                seen = True
                yield line
            yield from parser.feed(line)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    parser.stats.oversize_lines += counts.oversize_lines
    yield from parser.flush()


def _rebuild_times(steps: list[StepRecord], log_end: float) -> None:
    """Fill missing end times backwards from ``log_end`` using each step's total."""
    known = [s.total for s in steps if s.total is not None and s.total >= 0]
    fallback = sorted(known)[len(known) // 2] if known else 0.0
    anchor = log_end
    for record in reversed(steps):
        if record.end_time is not None and record.time_source == "line":
            anchor = record.end_time
        else:
            record.end_time = anchor
            record.time_source = "rebuilt"
        total = record.total if record.total is not None and record.total >= 0 else fallback
        anchor = record.end_time - total


def _time_events(ordered: list[Item], log_end: float | None = None) -> list[Event]:
    """Events in log order; those without a time get the previous step's end time, or
    ``log_end`` where no step has a time (a traceback pasted on its own)."""
    events: list[Event] = []
    last_end: float | None = None
    first_step = next((item for item in ordered if isinstance(item, StepRecord)), None)
    if first_step is not None and first_step.end_time is not None:
        last_end = first_step.end_time - (first_step.total or 0.0)
    for item in ordered:
        if isinstance(item, StepRecord):
            last_end = item.end_time
            continue
        if item.time is None and last_end is not None:
            item.time = last_end
            item.data.setdefault("time_rebuilt", True)
        elif item.time is None and log_end is not None:
            item.time = log_end
            item.data.setdefault("time_rebuilt", True)
            item.data.setdefault("time_from", "log_end")
        events.append(item)
    return events
