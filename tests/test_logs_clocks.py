"""The clocks a log carries in its text (tqdm, dated worker lines, HH:MM:SS stamps) and the
capture-time sidecar give the step end times of an offline analysis; the report names the
clock each time came from."""

from __future__ import annotations

import calendar
from pathlib import Path

import pytest

from monitor.analysis.summary import summarize
from monitor.logs.arrivals import sidecar_path
from monitor.logs.canonical_records import parse_file
from monitor.report import render_text
from tests.real_logs import analyze_doc

PREFIX = "(TaskRunner pid=77) "


def step_line(n: int, step_s: float, gen_s: float | None = None, **extra: float) -> str:
    gen = step_s * 0.6 if gen_s is None else gen_s
    fields = {"training/global_step": n, "timing_s/gen": gen,
              "timing_s/update_actor": step_s - gen - 1.0, "timing_s/step": step_s, **extra}
    return PREFIX + f"step:{n} - " + " - ".join(f"{k}:{v}" for k, v in fields.items())


def tqdm_line(done: int, total: int, elapsed_s: int) -> str:
    h, rest = divmod(elapsed_s, 3600)
    m, s = divmod(rest, 60)
    stamp = f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
    return (f"Training Progress:  {100 * done // total}%|##   | {done}/{total} "
            f"[{stamp}<10:00, 12.00s/it]")


def test_tqdm_elapsed_time_dates_each_step(tmp_path: Path) -> None:
    """verl draws the bar right after each step line: its elapsed time is the step's end. The
    steps' timers say 10 s each, the bar says 30 s apart: 20 s a step went before the timers."""
    lines = [tqdm_line(0, 10, 0)]
    for n in range(1, 6):
        lines += [step_line(n, 10.0), tqdm_line(n, 10, 30 * n)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    parsed = parse_file(log, log_end=10_000.0)
    # no dated line says when the bar ran: its spacing is measured, its dates end at log_end
    assert [s.time_source for s in parsed.steps] == ["tqdm_end"] * 5
    ends = [s.end_time for s in parsed.steps]
    assert [b - a for a, b in zip(ends, ends[1:], strict=False)] == [30.0] * 4
    wall = summarize(parsed.steps, parsed.events)["wall"]
    assert wall["span_s"] == pytest.approx(150.0 - 20.0)  # first step: its own timers only
    assert wall["clock"] == "tqdm_end" and wall["measured"] and not wall["dated"]
    assert wall["data_wait_s"] == pytest.approx(4 * (20.0 - 1.0))  # tqdm's 1 s resolution
    text = render_text(analyze_doc(log, log_end=10_000.0))
    assert "clock: tqdm's elapsed time (no dated line places the bar in time)" in text
    assert "UTC (estimated)" in text  # the dates, not the spacing
    assert "no timestamps" not in text


def test_a_restarted_bar_is_a_new_segment_and_nothing_is_invented(tmp_path: Path) -> None:
    """A resumed run draws a new bar from 0: its steps keep their spacing, and the two runs
    stand back to back (the text does not say how long the restart took)."""
    lines = [tqdm_line(0, 10, 0), step_line(1, 10.0), tqdm_line(1, 10, 12),
             step_line(2, 10.0), tqdm_line(2, 10, 24),
             "Setting global step to 2", tqdm_line(2, 10, 0),
             step_line(3, 10.0), tqdm_line(3, 10, 11), step_line(4, 10.0), tqdm_line(4, 10, 22)]
    log = tmp_path / "resumed.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log, log_end=5_000.0).steps
    ends = [s.end_time for s in steps]
    assert [s.time_source for s in steps] == ["tqdm_end"] * 4
    assert ends == [5_000.0 - 22 - 24 + 12, 5_000.0 - 22, 5_000.0 - 11, 5_000.0]


def test_dated_worker_lines_either_side_of_a_step_line_date_it(tmp_path: Path) -> None:
    """vLLM's 'INFO MM-DD HH:MM:SS' lines carry no year: the log's whole dates give it."""
    lines = ["2025-12-01 13:59:00,001\tINFO worker.py:1843 -- Started a local Ray instance."]
    for n, minute in enumerate((10, 20, 30), start=1):
        lines += [f"(WorkerDict pid=9) INFO 12-01 14:{minute:02d}:00 llm_engine.py:12] done",
                  step_line(n, 500.0),
                  f"(WorkerDict pid=9) INFO 12-01 14:{minute:02d}:01 llm_engine.py:12] start"]
    log = tmp_path / "dated.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log, log_end=9e9).steps
    base = calendar.timegm((2025, 12, 1, 14, 10, 0, 0, 0, 0))
    assert [s.time_source for s in steps] == ["worker"] * 3
    assert [s.end_time for s in steps] == [base + 0.5, base + 600.5, base + 1200.5]


def test_time_of_day_on_the_trainer_lines_is_the_step_end(tmp_path: Path) -> None:
    """'HH:MM:SS step:N - ...' takes the date of the dated line before it; past midnight the
    next day."""
    lines = ["[2025-08-17 23:50:00] starting",
             "23:55:00 " + step_line(1, 290.0).removeprefix(PREFIX),
             "00:00:10 " + step_line(2, 300.0).removeprefix(PREFIX)]
    log = tmp_path / "hms.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log, log_end=9e9).steps
    base = calendar.timegm((2025, 8, 17, 23, 55, 0, 0, 0, 0))
    assert [s.time_source for s in steps] == ["line", "line"]
    assert [s.end_time for s in steps] == [base, base + 310.0]


def test_capture_times_beside_the_log_are_used_offline(tmp_path: Path) -> None:
    """`verl-monitor run` writes '<offset> <unix>' per captured line to LOG.arrivals: an offline
    analyze of that log gives each step the time its line was captured."""
    lines = [step_line(n, 40.0) for n in range(1, 5)]
    log = tmp_path / "job.log"
    text = "\n".join(lines) + "\n"
    log.write_text(text)
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line.encode()) + 1
    captured = [1_700_000_000.0 + 45.0 * n for n in range(4)]
    sidecar_path(log).write_text("".join(f"{o} {t:.6f}\n" for o, t in zip(offsets, captured,
                                                                         strict=True)))
    doc = analyze_doc(log)
    steps = doc["steps"]
    assert [s["time_source"] for s in steps] == ["sidecar"] * 4
    assert [s["end_time"] for s in steps] == captured
    assert doc["summary"]["wall"]["data_wait_s"] == pytest.approx(3 * (5.0 - 0.05))
    report = render_text(doc)
    assert "capture times (the .arrivals file beside the log)" in report
    assert "no timestamps" not in report


def test_no_clock_at_all_is_said_and_the_times_are_estimated(tmp_path: Path) -> None:
    log = tmp_path / "bare.log"
    log.write_text("\n".join(step_line(n, 40.0) for n in range(1, 4)) + "\n")
    doc = analyze_doc(log, log_end=1_000.0)
    assert {s["time_source"] for s in doc["steps"]} == {"rebuilt"}
    report = render_text(doc)
    assert "estimated (rebuilt from the step times" in report
    assert "no timestamps, tqdm bar or dated lines, and no .arrivals file" in report


def test_a_bar_whose_count_is_not_the_step_does_not_date_it(tmp_path: Path) -> None:
    """A console capture that kept only the bar's last drawing prints '19/100' somewhere
    else: it dates no step."""
    lines = [step_line(1, 10.0), tqdm_line(19, 100, 3000), step_line(2, 10.0)]
    log = tmp_path / "capture.log"
    log.write_text("\n".join(lines) + "\n")
    assert {s.time_source for s in parse_file(log, log_end=100.0).steps} == {"rebuilt"}


def test_a_bar_drawn_ahead_of_its_step_line_dates_that_step(tmp_path: Path) -> None:
    """verl's V1 trainer under Ray: the bar goes to stderr, the step line to stdout, and the
    bar's '2/5' often comes out first. The drawing dates step 2, not step 1 before it."""
    lines = [tqdm_line(0, 5, 0)]
    for n in range(1, 6):
        bar, step = tqdm_line(n, 5, 30 * n), step_line(n, 25.0)
        lines += [bar, step] if n % 2 else [step, bar]  # both orders in one log
    log = tmp_path / "v1.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log, log_end=10_000.0).steps
    assert [s.time_source for s in steps] == ["tqdm_end"] * 5
    ends = [s.end_time for s in steps]
    assert [b - a for a, b in zip(ends, ends[1:], strict=False)] == [30.0] * 4


def test_a_captured_bar_dates_the_step_of_its_count_and_times_a_cut_line(
        tmp_path: Path) -> None:
    """wandb's output.log keeps the bar's line where it was first printed, as it stood later:
    '6/100 [01:40<...]' above step 1 says step 6 ended 100 s after the bar's start. Steps of
    10 s and a step 3 whose line lost its timers (cut at 4096 bytes): the bar leaves 50 s for
    step 3; step 8, also cut, takes its neighbours' 10 s plus the 40 s step 3 took beyond
    theirs. The wall from step 1's start to step 6's end is the bar's 100 s."""
    lines = [tqdm_line(6, 100, 100)]
    for n in range(1, 10):
        lines.append(PREFIX + f"step:{n} - global_seqlen/min:9 - val-core/acc:0.5" if n in (3, 8)
                     else step_line(n, 10.0))
    log = tmp_path / "output.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log, log_end=10_000.0).steps
    by_step = {s.step: s for s in steps}
    assert by_step[6].time_source == "tqdm_end"
    assert {s.time_source for s in steps if s.step != 6} == {"rebuilt"}
    start = by_step[1].end_time - 10.0
    assert by_step[6].end_time - start == pytest.approx(100.0)
    assert by_step[3].end_time - by_step[2].end_time == pytest.approx(50.0)
    assert by_step[8].end_time - by_step[7].end_time == pytest.approx(50.0)
    assert by_step[9].end_time == pytest.approx(10_000.0)


def test_a_log_full_of_dated_lines_keeps_a_few_readings_a_step() -> None:
    """Only the first and last dated line between two step lines are kept; a live parser
    (arrival times) keeps none."""
    from monitor.logs.parser import LogParser

    whole, live = LogParser(read_clocks=True), LogParser()
    for n in range(1, 4):
        for k in range(2000):
            line = f"(WorkerDict pid=9) INFO 12-01 14:{n:02d}:{k % 60:02d} engine.py:1] tick"
            whole.feed(line)
            live.feed(line)
        whole.feed(step_line(n, 10.0))
        live.feed(step_line(n, 10.0))
    assert len(whole.clock.readings) <= 3 * 2
    assert live.clock.readings == []


def test_dated_lines_while_the_bar_runs_date_it(tmp_path: Path) -> None:
    """A dated line after the bar's drawing of e s puts the bar's zero at its time less e or
    earlier, one before a drawing at its time less e + 1 or later: the middle of the two."""
    lines = [tqdm_line(0, 10, 0), "2025-12-01 10:00:05,000 INFO starting the first rollout",
             step_line(1, 10.0), tqdm_line(1, 10, 10),
             "2025-12-01 10:00:12,000 INFO starting the next rollout",
             step_line(2, 10.0), tqdm_line(2, 10, 20)]
    log = tmp_path / "dated_bar.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log, log_end=9e9).steps
    zero = calendar.timegm((2025, 12, 1, 10, 0, 0, 0, 0, 0))
    # highs: 10:00:12 - 10 s; lows: 10:00:05 - 10 s - 1 s, 10:00:12 - 20 s - 1 s
    origin = ((zero + 2.0) + (zero - 6.0)) / 2
    assert [s.time_source for s in steps] == ["tqdm", "tqdm"]
    assert [s.end_time for s in steps] == [origin + 10.0, origin + 20.0]
    assert "(estimated)" not in render_text(analyze_doc(log, log_end=9e9))


_ZONE_SCRIPT = """
import json, sys
from monitor.logs.canonical_records import parse_file
from monitor.logs.timestamps import split_timestamp
steps = parse_file(sys.argv[1], log_end=9e9).steps
print(json.dumps({"ends": [s.end_time for s in steps],
                  "sources": [s.time_source for s in steps],
                  "stamp": split_timestamp("2025-08-17 23:50:00 starting")[0]}))
"""


def test_naive_dates_and_time_of_day_read_in_the_hosts_zone(tmp_path: Path) -> None:
    """On a host at UTC+05:30 the dated line, the 'HH:MM:SS' step stamps (past midnight too)
    and the parser's own leading timestamp are one reading of the same wall clock: 5 h 30 m
    before the same figures read as UTC."""
    import json
    import os
    import subprocess
    import sys

    lines = ["2025-08-17 23:50:00 starting",
             "23:55:00 " + step_line(1, 290.0).removeprefix(PREFIX),
             "00:00:10 " + step_line(2, 300.0).removeprefix(PREFIX),
             "(WorkerDict pid=9) INFO 08-18 00:10:00 llm_engine.py:12] done",
             step_line(3, 500.0),
             "(WorkerDict pid=9) INFO 08-18 00:10:01 llm_engine.py:12] start"]
    log = tmp_path / "zoned.log"
    log.write_text("\n".join(lines) + "\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _ZONE_SCRIPT, str(log)], cwd=root,
                          env={**os.environ, "TZ": "Asia/Kolkata", "PYTHONPATH": str(root)},
                          capture_output=True, text=True, check=True, timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    shift = 5.5 * 3600
    base = calendar.timegm((2025, 8, 17, 23, 55, 0, 0, 0, 0)) - shift
    assert out["stamp"] == calendar.timegm((2025, 8, 17, 23, 50, 0, 0, 0, 0)) - shift
    assert out["sources"] == ["line", "line", "worker"]
    assert out["ends"] == [base, base + 310.0, base + 900.5]


# --- issue 37 item 2: clocks only from the log ------------------------------------------------

def test_a_bar_no_dated_line_places_starts_at_the_dated_line_before_it(tmp_path: Path) -> None:
    """Ray dates its start-up lines, then the bar runs with no dated line: the bar started at
    or after the last dated line (a copy of the log, with any modification time, reads the
    same), never at a time taken from the file."""
    import os

    lines = ["2025-05-22 07:03:31,997\tINFO job_manager.py:531 -- Runtime env is setting up.",
             tqdm_line(0, 5, 0)]
    for n in range(1, 6):
        lines += [step_line(n, 10.0), tqdm_line(n, 5, 10 * n)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    os.utime(log, (2_000_000_000, 2_000_000_000))
    parsed = parse_file(log)
    start = calendar.timegm((2025, 5, 22, 7, 3, 31)) + 0.997
    assert parsed.clock == "absolute"
    assert {s.time_source for s in parsed.steps} == {"tqdm_after"}
    assert parsed.steps[-1].end_time == pytest.approx(start + 50.0, abs=1.0)


def test_an_event_without_a_time_takes_the_dated_line_before_it(tmp_path: Path) -> None:
    """A crash before step 1 in a log of dated lines: the traceback is placed at the last
    dated line before it, not at 0 (the judge found it at 0 on five real crashes)."""
    log = tmp_path / "train.log"
    log.write_text(
        "(TaskRunner pid=1) INFO:2026-07-29 13:32:38,000:starting\n"
        "(TaskRunner pid=1) Traceback (most recent call last):\n"
        '(TaskRunner pid=1)   File "x.py", line 1, in <module>\n'
        "(TaskRunner pid=1) AssertionError: too large to fit in the bucket\n")
    parsed = parse_file(log)
    (tb,) = [e for e in parsed.events if e.kind == "traceback"]
    assert tb.time == pytest.approx(calendar.timegm((2026, 7, 29, 13, 32, 38)), abs=1.0)
    assert tb.data.get("time_from") == "dated_line" and parsed.clock == "absolute"


def test_a_log_with_no_clock_at_all_says_its_times_are_unknown(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    parsed = parse_file(log)
    assert parsed.clock == "none" and all(e.time is None for e in parsed.events)
    text = render_text(analyze_doc(log))
    assert "1970" not in text


def test_one_step_has_a_wall_time(tmp_path: Path) -> None:
    """A run of one step (a smoke test that then died): its wall time is its step's own."""
    log = tmp_path / "train.log"
    log.write_text("\n".join([tqdm_line(0, 1, 0), step_line(1, 226.6), tqdm_line(1, 1, 227)])
                   + "\n")
    wall = summarize(parse_file(log).steps)["wall"]
    assert wall["span_s"] == pytest.approx(226.6)


def test_the_wall_starts_at_the_bars_zero_when_the_first_batch_took_a_while(tmp_path: Path
                                                                            ) -> None:
    """The bar is drawn at 0 before the first batch is fetched: a video fork took 308 s there
    before step 1's timer; the wall is the bar's (was the timers' only, -11%)."""
    lines = [tqdm_line(0, 3, 0), step_line(1, 100.0), tqdm_line(1, 3, 400),
             step_line(2, 100.0), tqdm_line(2, 3, 500), step_line(3, 100.0),
             tqdm_line(3, 3, 600)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    parsed = parse_file(log)
    wall = summarize(parsed.steps, parsed.events, parsed.run_start)["wall"]
    assert wall["span_s"] == pytest.approx(600.0, abs=1.0)
    assert wall["data_wait_s"] == pytest.approx(300.0, abs=1.0)  # before step 1's timer


def test_the_bars_close_as_a_crash_unwinds_does_not_date_the_step(tmp_path: Path) -> None:
    """tqdm's close() redraws the last count as the crash unwinds, minutes later: the step
    ended at the drawing that counted it (2/12 at 22:35, not 31:53)."""
    lines = [tqdm_line(0, 12, 0), step_line(1, 740.0), tqdm_line(1, 12, 740),
             step_line(2, 615.0), tqdm_line(2, 12, 1355), "Traceback (most recent call last):",
             '  File "x.py", line 1, in <module>', "ConnectionError: broken",
             tqdm_line(2, 12, 1913)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    steps = parse_file(log).steps
    assert steps[1].end_time - steps[0].end_time == pytest.approx(615.0, abs=1.0)
