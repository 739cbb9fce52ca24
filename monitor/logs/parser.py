"""``LogParser``: one verl log, line by line, into canonical records and events.

Each line is unwrapped (``prefix``) and handed to the reader of its kind: console step lines
and timing breakdowns (``console``), file-logger JSONL objects (``jsonl``), multi-line blocks
(``blocks``) and single-line events (``events``). What spans lines stays here: the last step,
a resume in progress, a reshard or validation waiting for the next step record.
"""

from __future__ import annotations

from typing import Any

from monitor.logs.blocks import TRACEBACK_START, VALIDATION_START, BlockReader, HybridSwitch
from monitor.logs.clocks import LineClock
from monitor.logs.console import (
    BREAKDOWN_RE,
    STEP_ANYWHERE_RE,
    StepLineReader,
    read_breakdown,
    validation_only,
)
from monitor.logs.events import (
    GRAD_NOT_FINITE,
    SET_STEP_RE,
    FailureLines,
    checkpoint_load_event,
    memory_event,
    progress_event,
    sync_event,
    usable_seconds,
)
from monitor.logs.exception_lines import exception_line, is_frame_line
from monitor.logs.failure_lines import is_oom
from monitor.logs.jsonl import JsonlMerger, JsonStep, read_json_step
from monitor.logs.keys import other_seconds, phases_and_total
from monitor.logs.prefix import unwrap
from monitor.logs.stats import Item, ParseStats
from monitor.logs.timestamps import NaiveOrder
from monitor.logs.values import absurd_durations
from monitor.logs.vocabulary import Vocabulary
from monitor.numbers import finite_float
from monitor.records import Event, StepRecord

_GIB = float(2**30)


class LogParser:
    """Incremental parser of one verl log (console lines and/or file-logger JSONL lines).

    ``feed`` takes one physical line and returns what it completed; multi-line blocks
    (validation pprint, tracebacks, HybridEngine switches) and JSONL objects that may be merged
    with a following object of the same step are held until a later line or ``flush``. A live
    reader should call ``flush`` when the file has gone quiet (a poll returned no lines).
    ``source`` names the log in error samples. ``read_clocks``: keep the times the text
    carries (tqdm, dated lines) in ``clock`` for a whole-file reading (``parse_file``); a live
    reader, whose lines come with arrival times, leaves it off.
    """

    def __init__(self, source: str = "log", *, read_clocks: bool = False) -> None:
        self.source = source
        self.stats = ParseStats()
        self._vocabulary = Vocabulary()
        self._steps = StepLineReader()
        self._jsonl = JsonlMerger()
        self._blocks = BlockReader(self._exception_line)
        self._switch = HybridSwitch()
        self._failures = FailureLines()
        self._line_ip: str | None = None
        #: naive stamps kept in order through a DST fall-back (``timestamps.NaiveOrder``)
        self._naive = NaiveOrder()
        #: the times the text carries (tqdm, dated lines), each after the record before it
        self.clock = LineClock(enabled=read_clocks)
        self._last_record: StepRecord | None = None
        self._last_timed_record: StepRecord | None = None
        self._last_step: int | None = None
        #: the step a failure printed now is placed at: the last step record's, or the count of
        #: a progress bar drawn after it (the bar reads 116/1155: 116 steps have ended)
        self._place_step: int | None = None
        self._resume_since_step = False
        #: a reshard's seconds (weight sync, HybridEngine switch) for the next step record
        self._pending_reshard: float | None = None
        #: the step a pending sync belongs to, when its line says (the fully-async trainer's)
        self._pending_reshard_step: int | None = None
        #: (step, metrics) of a validation-only line, merged into a following record of that step
        self._pending_val: tuple[int, dict[str, Any]] | None = None

    # --- public -------------------------------------------------------------------------------

    @property
    def actors(self) -> frozenset[str]:
        """The Ray actor names the lines' prefixes showed so far."""
        return frozenset(self._vocabulary.prefixes)

    @property
    def version_guess(self) -> str:
        """The verl version range this log looks like (see ``keys.guess_version``)."""
        return self._vocabulary.version_guess()

    @property
    def idle(self) -> bool:
        """True when nothing read is held back (no open block, switch or JSONL object): every
        line fed so far has given its records, so a reader may save its position here."""
        return not (self._blocks.open or self._switch.open or self._jsonl.holding)

    def feed(self, line: str, arrival_time: float | None = None) -> list[Item]:
        """Parse one physical line (with or without its newline). Never raises."""
        self.stats.lines += 1
        out: list[Item] = []
        try:
            self._feed(line, arrival_time, out)
        except Exception as exc:  # noqa: BLE001 - the parser must survive any line
            self.stats.add_error(f"internal error {exc.__class__.__name__}", line)
        self._date_events(out)
        self.stats.count(out)
        return out

    def _date_events(self, out: list[Item]) -> None:
        """An event printed without a time of its own keeps the time of the last dated line
        before it (``dated_before``, from the log's own clock), for ``files.parse_file``."""
        last = self.clock.last_abs
        if last is None:
            return
        for item in out:
            if isinstance(item, Event) and item.time is None:
                item.data.setdefault("dated_before", last)

    def flush(self, arrival_time: float | None = None) -> list[Item]:
        """End pending multi-line blocks and merged JSONL objects; return what they make."""
        out: list[Item] = []
        try:
            self._blocks.close(out, self._last_step)
            self._close_switch(out)
            self._close_json(out)
        except Exception as exc:  # noqa: BLE001
            self.stats.add_error(f"internal error {exc.__class__.__name__}", "<flush>")
        self._date_events(out)
        self.stats.count(out)
        return out

    # --- line dispatch ------------------------------------------------------------------------

    def _feed(self, raw: str, arrival: float | None, out: list[Item]) -> None:
        if "\ufffd" in raw:
            # the reader replaced invalid UTF-8 (free to test on ASCII/latin-1 text)
            self.stats.bad_utf8_lines += 1
        line, ts, text, actor, self._line_ip, repeated, naive = unwrap(raw)
        if naive and ts is not None:
            ts = self._naive.read(ts)  # in order through a DST fall-back's repeated hour
        if actor:
            self._vocabulary.prefixes.add(actor)
        when = ts if ts is not None else arrival

        if self._blocks.open and self._blocks.feed(text, when, out, self._last_step):
            return
        if self._switch.open and "[HybridEngine]" not in text and not text.isspace():
            self._close_switch(out)

        if text.startswith("step:"):
            self._step_line(text[5:], ts, arrival, line, out)
            return
        stripped = text.strip()
        if not stripped:
            return
        if ts is not None:
            self.clock.stamp(ts, self._last_record)
        else:
            rest = self.clock.line(text, self._last_record)
            if rest is not text and rest.startswith("step:"):
                # a step line stamped with the time of day (or vLLM-style month-day)
                before = len(out)
                self._step_line(rest[5:], ts, arrival, line, out)
                if len(out) > before and isinstance(out[-1], StepRecord):
                    self.clock.own(out[-1])
                return
        if stripped[0] == "{":
            self._json_line(stripped, arrival, line, out)
            return
        before = len(out)
        if self._other_line(stripped, ts, when, line, out):
            if repeated > 1:
                for item in out[before:]:
                    if isinstance(item, Event):
                        item.data["repeated"] = repeated
            return
        match = STEP_ANYWHERE_RE.search(text)
        if match is not None and " - " in text[match.end() :]:
            self._step_line(text[match.end() :], ts, arrival, line, out)
            return
        self.stats.noise_lines += 1

    def _other_line(
        self, stripped: str, ts: float | None, when: float | None, line: str, out: list[Item]
    ) -> bool:
        """Every single-line event and block start. True when the line was used."""
        step = self._last_step
        if "Training Progress" in stripped:
            event = progress_event(stripped, when)
            if event is None:
                self.stats.noise_lines += 1
            else:
                out.append(event)
                if event.data.get("current"):
                    self._place_step = int(event.data["current"])
                self._after_bar(stripped, when, out)
                # verl draws the bar right after logging the step's metrics: the last record
                # with a step timer (another process's line may have come in between)
                self.clock.tqdm(event.data.get("elapsed_s"),
                                self._last_timed_record or self._last_record,
                                event.data.get("current"))
            return True
        if "validation metrics:" in stripped and any(s in stripped for s in VALIDATION_START):
            self._blocks.start_validation(stripped, when, out, step)
            return True
        if stripped.startswith("Step ") and "=" in stripped:
            match = BREAKDOWN_RE.match(stripped)
            if match is not None:
                self._breakdown(match, ts, when, line, out)
                return True
        if GRAD_NOT_FINITE in stripped and self._failures.grad_not_finite(
                stripped, line, when, out, step, self._line_ip):
            return True
        used = is_oom(stripped)
        if self._failure_line(stripped, when, out, used):
            return True
        if TRACEBACK_START in stripped:
            self._blocks.start_traceback(stripped, when, out, self._place_step)
            return True
        if "[HybridEngine]" in stripped:
            self._set_reshard(self._switch.feed(stripped, when, out, step))
            return True
        if "sync_weights success" in stripped or "_fit_update_weights, timing_s/" in stripped:
            event = sync_event(stripped, when, step)
            if event is None:
                self.stats.add_error("unreadable weight-sync line", line)
            else:
                out.append(event)
                self._set_reshard(usable_seconds(event.data["seconds"]))
                if event.data.get("source") == "fully_async_trainer":
                    self._pending_reshard_step = event.step  # the version it made
            return True
        if "Setting global step to" in stripped:
            match = SET_STEP_RE.search(stripped)
            if match is not None:
                set_to = int(match.group(1))
                out.append(Event("resume", when, set_to, stripped,
                                 {"reason": "setting_global_step"}))
                self._resume_since_step = True
                return True
        if "Load from checkpoint folder" in stripped:
            out.append(checkpoint_load_event(stripped, when, step))
            return True
        if "memory allocated (GB)" in stripped:
            event = memory_event(stripped, when, step)
            if event is not None:
                out.append(event)
                return True
        if not used:
            return self._exception_start(stripped, when, out)
        return used

    def _failure_line(self, stripped: str, when: float | None, out: list[Item],
                      oom: bool) -> bool:
        """An out-of-memory line (an ``oom`` event; False: the line may start a traceback
        too) or a failure line (True); a Ray ``RayTaskError(X)`` line also opens a traceback,
        since the worker's frames and exception follow it."""
        place = self._place_step
        if oom:
            self._failures.oom(stripped, when, out, place, self._line_ip)
            return False
        if not self._failures.failure(stripped, when, out, place, self._line_ip):
            return False
        found = exception_line(stripped) if "RayTaskError(" in stripped else None
        if found is not None:
            self._blocks.start_exception(stripped, found, when, out, place)
        return True

    def _exception_start(self, stripped: str, when: float | None, out: list[Item]) -> bool:
        """A raised exception's line, or a traceback's frame, printed without the traceback's
        header (a quote, a log cut short): a ``traceback`` event all the same."""
        found = exception_line(stripped)
        if found is not None:
            self._blocks.start_exception(stripped, found, when, out, self._place_step)
            return True
        if stripped.startswith('File "') and is_frame_line(stripped):
            self._blocks.start_traceback(stripped, when, out, self._place_step, headless=True)
            return True
        return False

    def _exception_line(
        self, text: str, when: float | None, out: list[Item], frames: list[str]
    ) -> None:
        """The exception line that ends a traceback: an OOM (with the frames' phase) or a
        failure event."""
        if is_oom(text):
            self._failures.oom(text, when, out, self._place_step, self._line_ip, frames)
        else:
            self._failures.failure(text, when, out, self._place_step, self._line_ip)

    def _after_bar(self, stripped: str, when: float | None, out: list[Item]) -> None:
        """What a line prints after its progress bar (tqdm and another process share the line:
        ``... 116/1155 [1:02:03<...] (raylet) ... killed due to memory pressure``): a failure
        there is placed at the bar's count."""
        at = stripped.rfind("Training Progress")
        close = stripped.find("]", at)
        rest = stripped[close + 1:].strip() if close >= 0 else ""
        if not rest or "Training Progress" in rest:
            return
        after = unwrap(rest)
        text, ip = after.text.strip(), after.ip or self._line_ip
        if not text:
            return
        if is_oom(text):
            self._failures.oom(text, when, out, self._place_step, ip)
        else:
            self._failures.failure(text, when, out, self._place_step, ip)

    # --- step records ---------------------------------------------------------------------------

    def _step_line(
        self, body: str, ts: float | None, arrival: float | None, line: str, out: list[Item]
    ) -> None:
        read = self._steps.read(body)
        if read.step is None:
            self.stats.add_error(read.problem or "bad step line", line)
            return
        if self._vocabulary.voting:
            self._vocabulary.vote(read.body, read.numpy_values)
        if read.problem is not None:
            self.stats.add_error(read.problem, line)
            if not read.metrics:
                return
        if ts is not None:
            end_time, source = ts, "line"
        else:
            end_time, source = arrival, "arrival"
        self._emit_metrics(
            read.step, read.metrics, end_time, source, "console", out,
            known_keys=read.same_keys and read.problem is None,
        )

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
        """A validation event for validation-only metrics, else a step record (after a
        ``resume`` event when the step went back), merged with the validation line just before
        it of the same step, its absurd timers skipped.
        ``known_keys``: the keys are those of the previous step line (already recorded)."""
        if metrics and validation_only(metrics):
            self._validation_step(step, metrics, end_time, "step", out)
            return
        if not known_keys:
            self._vocabulary.keys.update(metrics)
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
        hint = self._vocabulary.old_era_hint
        pending_val = self._pending_val
        if pending_val is not None:
            self._pending_val = None
            if pending_val[0] == step:
                # validation printed just before the training line of the same step: one step
                metrics = {**pending_val[1], **metrics}
        metrics = self._skip_absurd(step, metrics)
        phases, total = phases_and_total(metrics, version_hint=hint)
        record = StepRecord(
            step=step,
            end_time=end_time,
            total=total,
            phases=phases,
            throughput=finite_float(metrics.get("perf/throughput")),
            mem_allocated_peak_bytes=_gib_bytes(metrics, "max_memory_allocated_gb"),
            mem_reserved_peak_bytes=_gib_bytes(metrics, "max_memory_reserved_gb"),
            metrics=metrics,
            time_source=time_source,
            source=source,
        )
        self._apply_pending_reshard(record, old_era=hint is not None)
        self._last_record = record
        if total is not None:
            self._last_timed_record = record
        self._last_step = step
        self._place_step = step
        self._resume_since_step = False
        self._failures.reset()
        out.append(record)

    def _validation_step(self, step: int, metrics: dict[str, Any], end_time: float | None,
                         origin: str, out: list[Item]) -> None:
        """A validation-only line or object: an event now, merged into the step's record."""
        out.append(Event("validation", end_time, step, "", {"metrics": metrics, "origin": origin}))
        self._pending_val = (step, metrics)

    def _skip_absurd(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` without its absurd timers (negative, or over 30 days), each counted as a
        parse error saying which value was skipped."""
        absurd = absurd_durations(metrics)
        for key, value in absurd.items():
            self.stats.add_error(f"absurd value for {key!r} ({value:g} s), skipped",
                                 f"step:{step} {key}:{value:g}")
        return {k: v for k, v in metrics.items() if k not in absurd} if absurd else metrics

    def _breakdown(self, match: Any, ts: float | None, when: float | None, line: str,
                   out: list[Item]) -> None:
        record = read_breakdown(match, when, "line" if ts is not None else "arrival")
        if record is None:
            self.stats.add_error("breakdown line without fields", line)
            return
        self._apply_pending_reshard(record, old_era=True)
        self._vocabulary.keys.update(record.metrics)
        self._last_record = record
        self._last_step = self._place_step = record.step
        self._resume_since_step = False
        out.append(record)

    def _set_reshard(self, seconds: float | None) -> None:
        if seconds is not None:
            self._pending_reshard = seconds
            self._pending_reshard_step = None

    def _apply_pending_reshard(self, record: StepRecord, *, old_era: bool = False) -> None:
        """A weight sync printed on a line of its own goes to the next step-timed record, once:
        a record that times its own sync (``param_sync``, ``update_weights``) takes its place,
        and a record without a step time (the rollouter's line) does not take it."""
        if self._pending_reshard is None:
            return
        if "reshard" in record.phases and record.total is None:
            # a sync timed on a line of its own (the fully-async trainer's param_sync): the
            # sync line printed before it was the same sync
            self._pending_reshard = self._pending_reshard_step = None
            return
        if record.total is None:
            return
        owner = self._pending_reshard_step
        if "reshard" in record.phases or (owner is not None and record.step > owner):
            # the record's own timer (the line was the same sync), or a later step's record:
            # the sync printed for step N belongs to no other step
            self._pending_reshard = self._pending_reshard_step = None
            return
        if owner is not None and record.step != owner:
            return
        record.phases["reshard"] = self._pending_reshard
        self._pending_reshard = self._pending_reshard_step = None
        if record.total is not None:
            record.phases["other"] = other_seconds(
                record.total, record.phases, include_outside_step=old_era
            )

    def _close_switch(self, out: list[Item]) -> None:
        self._set_reshard(self._switch.close(out, self._last_step))

    # --- JSONL ----------------------------------------------------------------------------------

    def _json_line(self, text: str, arrival: float | None, line: str, out: list[Item]) -> None:
        read = read_json_step(text)
        if read is None:
            self.stats.noise_lines += 1
            return
        if isinstance(read, str):
            self.stats.add_error(read, line)
            return
        if read.end_time is None:
            read.end_time, read.time_source = arrival, "arrival"
        if self._jsonl.merge(read):
            return
        if read.metrics and validation_only(read.metrics):
            self._validation_step(read.step, read.metrics, read.end_time, "jsonl", out)
            return
        self._close_json(out)
        self._jsonl.start(read)

    def _close_json(self, out: list[Item]) -> None:
        done: JsonStep | None = self._jsonl.close()
        if done is not None:
            self._emit_metrics(
                done.step, done.metrics, done.end_time, done.time_source, "jsonl", out
            )


def _gib_bytes(metrics: dict[str, Any], name: str) -> float | None:
    value = finite_float(metrics.get("perf/" + name))
    if value is None:
        value = finite_float(metrics.get("actor/perf/" + name))
    return None if value is None else value * _GIB
