"""verl_log collector on real files: appended, rotated, truncated, missing at first."""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client import CollectorRegistry

from exporters.collectors.verl_log import StepTotals, VerlLogCollector
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext
from monitor.live.live_monitor import Recorder
from monitor.live.rolling_window import RollingWindow
from monitor.records import ALL_PHASES, StepRecord
from monitor.store import RunStore, StoreWriter


def line(step: int, gen: float = 10.0, total: float = 20.0, extra: str = "") -> str:
    return (f"(TaskRunner pid=11) step:{step} - timing_s/gen:{gen} - timing_s/reshard:1.5 - "
            f"timing_s/update_actor:5.0 - timing_s/step:{total} - perf/throughput:1234.5 - "
            f"perf/max_memory_reserved_gb:40.0 - training/global_step:{step}{extra}\n")


def make(paths, store=None):
    window = RollingWindow()
    ctx = ExporterContext(node="n0", interval=1.0, sink=Recorder(window, store),
                          options=ExporterOptions(log=tuple(str(p) for p in paths)))
    col = VerlLogCollector(ctx)
    reg = CollectorRegistry()
    reg.register(col)
    return col, reg, window


def test_steps_phases_and_counters_from_an_appended_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(line(1) + "Training Progress:  1%|          | 1/100 [00:20<33:00, 20.0s/it]\n")
    col, reg, window = make([log])
    assert col.sample_once()
    assert reg.get_sample_value("verlmon_training_step") == 1
    assert reg.get_sample_value("verlmon_training_steps_total") == 1
    assert reg.get_sample_value("verlmon_step_duration_seconds") == 20.0
    assert reg.get_sample_value("verlmon_phase_duration_seconds", {"phase": "reshard"}) == 1.5
    assert reg.get_sample_value("verlmon_phase_duration_seconds",
                                {"phase": "update_actor"}) == 5.0
    assert reg.get_sample_value("verlmon_throughput_tokens_per_second") == 1234.5
    assert reg.get_sample_value("verlmon_memory_reserved_peak_bytes") == 40 * 2**30
    assert reg.get_sample_value("verlmon_log_lines_total", {"log": str(log)}) == 2
    since = reg.get_sample_value("verlmon_seconds_since_last_step")
    assert since is not None and since >= 0
    last_ts = reg.get_sample_value("verlmon_last_step_timestamp_seconds")
    assert abs(last_ts - time.time()) < 3600
    with log.open("a") as fh:
        fh.write(line(2, gen=30.0, total=40.0))
        fh.write("step:3 - timing_s/gen:abc - timing_s/step:xyz\n")  # a broken metrics line
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    col.sample_once()
    col.sample_once()  # quiet poll: held blocks are flushed
    assert reg.get_sample_value("verlmon_training_step") == 2
    assert reg.get_sample_value("verlmon_step_duration_seconds") == 40.0
    assert reg.get_sample_value("verlmon_log_parse_errors_total", {"log": str(log)}) == 1
    assert reg.get_sample_value("verlmon_log_events_total", {"kind": "oom"}) == 1
    steps, _, _, events = window.frames()
    assert [s.step for s in steps] == [1, 2]
    assert any(e.kind == "oom" for e in events)


def test_log_that_appears_later_then_is_rotated_and_truncated(tmp_path):
    log = tmp_path / "later.log"
    col, reg, _ = make([log])
    assert col.sample_once()  # no file yet: waited for, not an error
    assert reg.get_sample_value("verlmon_log_lines_total", {"log": str(log)}) == 0
    assert reg.get_sample_value("verlmon_training_step") is None
    log.write_text(line(1) + line(2))
    col.sample_once()
    assert reg.get_sample_value("verlmon_training_step") == 2
    # rotation: the file is renamed away, a new one continues
    os.rename(log, tmp_path / "later.log.1")
    log.write_text(line(3))
    col.sample_once()
    assert reg.get_sample_value("verlmon_training_step") == 3
    assert reg.get_sample_value("verlmon_training_steps_total") == 3
    # truncation (verl's file logger truncates on resume): read again from the start
    log.write_text("")
    col.sample_once()
    log.write_text(line(1))
    col.sample_once()
    col.sample_once()
    assert reg.get_sample_value("verlmon_training_step") == 1
    assert reg.get_sample_value("verlmon_log_events_total", {"kind": "truncated"}) >= 1
    assert reg.get_sample_value("verlmon_training_steps_total") == 4


def test_jsonl_log_and_store(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 1, "data": {"timing_s/gen": 4.0, "timing_s/step": 8.0}}\n'
                   '{"step": 2, "data": {"timing_s/gen": 5.0, "timing_s/step": 9.0}}\n')
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store)
    col, reg, _ = make([log], store=writer)
    col.sample_once()
    col.sample_once()  # the last JSONL object is held for a possible merge until quiet
    assert reg.get_sample_value("verlmon_training_step") == 2
    assert reg.get_sample_value("verlmon_phase_duration_seconds", {"phase": "gen"}) == 5.0
    assert writer.flush()
    assert [s.step for s in store.steps()] == [1, 2]
    store.close()


@pytest.mark.parametrize("paths", [[], None])
def test_no_logs_no_series(paths):
    ctx = ExporterContext(node="n0", interval=1.0, sink=Recorder(RollingWindow()),
                          options=ExporterOptions(log=tuple(paths or ())))
    col = VerlLogCollector(ctx)
    assert col.sample_once()
    assert list(col.collect()) == []


def test_counters_accumulate_every_step_so_shares_are_exact_over_any_range(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("")
    col, reg, _window = make([log])
    col.sample_once()
    # before any step: every canonical phase is there at 0, the histogram is empty
    for phase in ALL_PHASES:
        assert reg.get_sample_value("verlmon_phase_seconds_total", {"phase": phase}) == 0
    assert reg.get_sample_value("verlmon_step_seconds_count") == 0
    assert reg.get_sample_value("verlmon_data_wait_seconds_total") == 0
    with log.open("a") as fh:
        fh.write(line(1, gen=10.0, total=20.0))
        fh.write(line(2, gen=30.0, total=40.0))
        fh.write(line(3, gen=200.0, total=400.0))
    col.sample_once()
    col.sample_once()
    # three steps between two scrapes: the last-step gauge shows only step 3, the counters all
    # (gen less the 1.5 s reshard timed inside it, as the parser gives it)
    assert reg.get_sample_value("verlmon_phase_duration_seconds", {"phase": "gen"}) == 198.5
    assert reg.get_sample_value("verlmon_phase_seconds_total", {"phase": "gen"}) == 235.5
    assert reg.get_sample_value("verlmon_phase_seconds_total", {"phase": "reshard"}) == 4.5
    assert reg.get_sample_value("verlmon_step_seconds_count") == 3
    assert reg.get_sample_value("verlmon_step_seconds_sum") == 460.0
    assert reg.get_sample_value("verlmon_step_seconds_bucket", {"le": "20.0"}) == 1
    assert reg.get_sample_value("verlmon_step_seconds_bucket", {"le": "45.0"}) == 2
    assert reg.get_sample_value("verlmon_step_seconds_bucket", {"le": "300.0"}) == 2
    assert reg.get_sample_value("verlmon_step_seconds_bucket", {"le": "+Inf"}) == 3


def test_step_totals_sum_data_wait_and_skip_unusable_values():
    totals = StepTotals()
    totals.add(StepRecord(step=1, total=10.0, phases={"gen": 4.0, "bogus": 9.0},
                          data_wait=2.5))
    totals.add(StepRecord(step=2, total=None, phases={"gen": float("nan")}, data_wait=None))
    totals.add(StepRecord(step=3, total=-1.0, phases={"gen": 1.0}, data_wait=0.5))
    assert totals.data_wait == 3.0
    assert totals.phase_seconds["gen"] == 5.0 and "bogus" not in totals.phase_seconds
    assert (totals.step_count, totals.step_sum) == (1, 10.0)


# --- restarts: positions saved with the steps, resumed from the store ------------------------


def run_exporter(tmp_path, log_paths, *, from_end=False, polls=2):
    """One 'exporter process': a collector and a store writer on run.db; polls, flushes,
    closes the store (like kill -9 after the last flush: nothing else is written)."""
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store, compact_interval_s=None)
    window = RollingWindow()
    ctx = ExporterContext(node="n0", interval=1.0, sink=Recorder(window, writer),
                          options=ExporterOptions(log=tuple(str(p) for p in log_paths),
                                                  log_from_end=from_end))
    col = VerlLogCollector(ctx)
    reg = CollectorRegistry()
    reg.register(col)
    for _ in range(polls):
        col.sample_once()
    assert writer.flush()
    col.close()
    store.close()
    return col, reg


def stored_steps(tmp_path):
    store = RunStore(tmp_path / "run.db")
    try:
        return store.steps(), store.events()
    finally:
        store.close()


def test_a_restart_resumes_at_the_saved_position_and_keeps_the_first_times(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(line(i) for i in range(1, 12)))
    log.open("a").write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    run_exporter(tmp_path, [log])
    first, events = stored_steps(tmp_path)
    times = {s.step: s.end_time for s in first}
    assert len(first) == 11 and [e.kind for e in events].count("oom") == 1
    with log.open("a") as fh:  # written while the exporter was down
        fh.write("".join(line(i) for i in range(12, 23)))
    time.sleep(0.01)
    run_exporter(tmp_path, [log])
    steps, events = stored_steps(tmp_path)
    assert sorted(s.step for s in steps) == list(range(1, 23))  # every step once
    assert {s.step: s.end_time for s in steps if s.step <= 11} == times  # not re-stamped
    assert [e.kind for e in events].count("oom") == 1
    # the lines written while it was down carry no time: rebuilt back from the file's last
    # write, after the first run's steps
    later = [s for s in steps if s.step >= 12]
    assert {s.time_source for s in later} == {"rebuilt"}
    ends = [s.end_time for s in later]
    assert ends == sorted(ends) and ends[0] > max(times.values())
    assert log.stat().st_mtime - 1e-6 <= ends[-1] <= time.time()  # the last write (or the save)


def test_a_step_the_log_repeats_is_stored_once_and_a_true_resume_is_kept(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(line(i) for i in range(1, 6)))
    run_exporter(tmp_path, [log])
    with log.open("a") as fh:
        fh.write("".join(line(i) for i in range(1, 6)))  # the same lines again (a copy)
        fh.write("Setting global step to 3\n")
        fh.write("".join(line(i, gen=11.0, total=21.0) for i in range(4, 7)))  # resumed
    run_exporter(tmp_path, [log])
    steps, events = stored_steps(tmp_path)
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 4, 5, 6]
    assert [e.kind for e in events].count("resume") == 1


def test_log_from_end_starts_at_the_end_only_the_first_time(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(line(i) for i in range(1, 4)))
    run_exporter(tmp_path, [log], from_end=True)
    with log.open("a") as fh:
        fh.write("".join(line(i) for i in range(4, 6)))
    run_exporter(tmp_path, [log], from_end=True)  # steps 4-5 came while it was down
    steps, _ = stored_steps(tmp_path)
    assert [s.step for s in steps] == [4, 5]


@pytest.mark.parametrize("how", ["rename", "copytruncate"])
def test_a_log_rotated_while_down_is_finished_before_the_new_one(tmp_path, how):
    log = tmp_path / "train.log"
    log.write_text("".join(line(i) for i in range(1, 4)))
    run_exporter(tmp_path, [log])
    with log.open("a") as fh:
        fh.write("".join(line(i) for i in range(4, 6)))  # after the kill, before the rotation
    rotated = tmp_path / "train.log.1"
    if how == "rename":
        log.rename(rotated)
    else:
        rotated.write_bytes(log.read_bytes())
        with log.open("r+") as fh:
            fh.truncate(0)
    with log.open("a") as fh:
        fh.write("".join(line(i) for i in range(6, 8)))
    col, reg = run_exporter(tmp_path, [log], polls=3)
    steps, _ = stored_steps(tmp_path)
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6, 7]
    assert reg.get_sample_value("verlmon_log_unrecovered_total", {"log": str(log)}) == 0


def test_a_position_whose_file_is_gone_is_counted_and_said_in_one_line(tmp_path, caplog):
    log = tmp_path / "train.log"
    log.write_text("".join(line(i) for i in range(1, 4)))
    run_exporter(tmp_path, [log])
    log.unlink()  # rotated away and compressed, say: nothing to finish
    log.write_text(line(9))
    with caplog.at_level("WARNING", logger="verl_monitor.exporter"):
        col, reg = run_exporter(tmp_path, [log])
    assert reg.get_sample_value("verlmon_log_unrecovered_total", {"log": str(log)}) == 1
    said = [r.getMessage() for r in caplog.records if "no copy of it was found" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]
    steps, events = stored_steps(tmp_path)
    assert [s.step for s in steps] == [1, 2, 3, 9]
    assert any(e.kind == "truncated" and e.data.get("reason") == "lost" for e in events)


def test_console_and_jsonl_records_of_one_step_in_one_poll_keep_both_rows(tmp_path):
    console, jsonl = tmp_path / "train.log", tmp_path / "train.jsonl"
    console.write_text(line(1))
    jsonl.write_text('{"step": 1, "data": {"timing_s/step": 20.0, "timing_s/gen": 10.0}}\n')
    run_exporter(tmp_path, [console, jsonl])
    steps, _ = stored_steps(tmp_path)
    assert sorted(s.source for s in steps) == ["console", "jsonl"]


def test_a_jsonl_object_held_for_merging_is_read_again_after_a_restart(tmp_path):
    """The parser holds the last JSONL object until the next one (or a quiet poll): the
    position saved never passes it, so a kill meanwhile loses nothing."""
    log = tmp_path / "train.jsonl"
    log.write_text("".join(f'{{"step": {i}, "data": {{"timing_s/step": 2.0}}}}\n'
                           for i in range(1, 4)))
    run_exporter(tmp_path, [log], polls=1)  # no quiet poll: step 3 is still held
    steps, _ = stored_steps(tmp_path)
    assert [s.step for s in steps] == [1, 2]
    run_exporter(tmp_path, [log], polls=2)
    steps, _ = stored_steps(tmp_path)
    assert [s.step for s in steps] == [1, 2, 3]


def test_a_log_in_a_missing_folder_is_reported_every_poll(tmp_path):
    col, _, _ = make([tmp_path / "nope" / "train.log"])
    for _ in range(2):
        assert not col.sample_once()
        assert "does not exist" in col.last_error


# --- every step record kept once, whatever the log did (issue 30 row 2) ----------------------


def resumed_log(path):
    """Steps 1-10, a checkpoint resume at 5, then steps 6-15 again with other values."""
    path.write_text("".join(line(i) for i in range(1, 11)) + "Setting global step to 5\n"
                    + "".join(line(i, gen=11.0, total=21.0) for i in range(6, 16)))


def test_a_first_start_on_a_log_holding_a_resume_stores_all_twenty_steps(tmp_path):
    log = tmp_path / "train.log"
    resumed_log(log)
    col, reg = run_exporter(tmp_path, [log])
    steps, events = stored_steps(tmp_path)
    assert len(steps) == 20, sorted(s.step for s in steps)
    assert sorted(s.step for s in steps) == sorted([*range(1, 11), *range(6, 16)])
    assert reg.get_sample_value("verlmon_training_steps_total") == 20
    # the backlog is not stamped with one arrival time: rebuilt back from the last write
    assert {s.time_source for s in steps} == {"rebuilt"}
    assert len({s.end_time for s in steps}) == 20


def test_a_resume_read_in_one_live_poll_keeps_both_attempts_and_is_counted(tmp_path):
    """Lines that arrive together share an arrival time: two records of one step would
    share (step, end time, source) and the store would keep one. They are kept apart."""
    log = tmp_path / "train.log"
    log.write_text("")
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store, compact_interval_s=None)
    col, reg, _ = make([log], store=writer)
    col.sample_once()  # the empty file: live from here
    # no step total: nothing to rebuild times from, every record arrives at once
    resumed_log(log)
    log.write_text(log.read_text().replace("timing_s/step:", "timing_s/other:"))
    col.sample_once()
    assert writer.flush()
    steps = store.steps()
    store.close()
    assert len(steps) == 20
    assert reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": str(log), "reason": "step_time_clash"}) == 5


def test_the_store_never_replaces_a_step_record_with_another(tmp_path):
    """Two different records of one step with one end time and source are both kept."""
    store = RunStore(tmp_path / "run.db")
    a = StepRecord(step=6, end_time=1000.0, total=20.0, source="console")
    b = StepRecord(step=6, end_time=1000.0, total=21.0, source="console")
    store.add_steps([a])
    store.add_steps([b, a])  # a again: the same record, stored once
    steps = store.steps()
    store.close()
    assert sorted(s.total for s in steps) == [20.0, 21.0]


def test_a_log_rewritten_in_place_while_down_loses_no_step_and_is_counted(tmp_path):
    """Issue 30 row 3: same inode, same first 4 KB, longer than before."""
    log = tmp_path / "train.log"
    header = "".join(f"(TaskRunner pid=11) config line {i:04d}\n" for i in range(150))
    log.write_text(header + "".join(line(i) for i in range(1, 21)))
    run_exporter(tmp_path, [log])
    with open(log, "r+") as fh:  # rewritten through the same inode while the exporter is down
        fh.truncate(0)
        fh.write(header + "".join(line(i, gen=12.0, total=22.0) for i in range(1, 41)))
    col, reg = run_exporter(tmp_path, [log])
    steps, events = stored_steps(tmp_path)
    assert len([s for s in steps if s.total == 22.0]) == 40
    assert reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": str(log), "reason": "rewritten"}) == 1
    assert any(e.kind == "truncated" and e.data.get("reason") == "rewritten" for e in events)


def test_a_backlog_captured_by_run_takes_the_capture_times(tmp_path):
    """Issue 28 item 2: an exporter started late on a log ``verl-monitor run`` captured
    gives each backlog line the time run recorded for it."""
    from monitor.logs.arrivals import ArrivalWriter

    log = tmp_path / "train.log"
    text = "".join(line(i) for i in range(1, 6))
    log.write_text(text)
    writer = ArrivalWriter(log)
    offset = 0
    for i, ln in enumerate(text.splitlines(keepends=True)):
        writer.record(offset, 1_700_000_000.0 + 30.0 * i)
        offset += len(ln.encode())
    writer.close()
    run_exporter(tmp_path, [log])
    steps, _ = stored_steps(tmp_path)
    assert [s.end_time for s in steps] == [1_700_000_000.0 + 30.0 * i for i in range(5)]
    assert {s.time_source for s in steps} == {"arrival"}


def test_lines_read_live_take_the_capture_times_not_the_poll_time(tmp_path):
    """Read as the job prints (not only as a backlog), a line captured by ``verl-monitor run``
    (or the simulator) ends its step when it was captured, not when the poll read it."""
    from monitor.logs.arrivals import ArrivalWriter

    log = tmp_path / "train.log"
    log.write_text("")
    col, _, window = make([log])
    col.sample()  # following: the backlog (none) is read
    writer = ArrivalWriter(log)
    with log.open("a") as fh:
        for i in range(1, 4):
            writer.record(fh.tell(), 1_700_000_000.0 + 20.0 * i)
            fh.write(line(i))
    writer.close()
    col.sample()
    steps, _, _, _ = window.frames()
    assert [s.end_time for s in steps] == [1_700_000_000.0 + 20.0 * i for i in range(1, 4)]
    # the gap between two lines is the step's own 20 s: no data wait is made up by the poll
    assert [s.data_wait for s in steps[1:]] == [0.0, 0.0]


def test_a_sidecar_that_cannot_be_read_is_counted_once_and_never_waited_on(tmp_path):
    """Issue 41 item 2: a FIFO at ``<log>.arrivals`` hung the reader for good; now the backlog
    is read, its times rebuilt, and the sidecar counted once as a side file not used."""
    import os
    import threading

    log = tmp_path / "train.log"
    log.write_text("".join(line(i) for i in range(1, 4)))
    os.mkfifo(str(log) + ".arrivals")
    col, reg, window = make([log])
    t = threading.Thread(target=lambda: [col.sample_once() for _ in range(3)], daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "blocked on the FIFO"
    assert [s.step for s in window.frames()[0]] == [1, 2, 3]
    assert reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": str(log), "reason": "side_file"}) == 1


def test_a_path_that_is_a_directory_is_counted_and_not_read(tmp_path):
    log = tmp_path / "train.log"
    log.mkdir()
    col, reg, _ = make([log])
    for _ in range(3):
        col.sample_once()
    assert reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": str(log), "reason": "not_regular"}) == 1


# --- time zones and skewed clocks (issue 30 row 5) -------------------------------------------

LIVE_STALL_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, "tests")
from test_exporters_collectors_verl_log import line, make
from monitor.config import load_config
from monitor.detect import make_context
from monitor.detect.health import detect_stalled
from monitor.frames import empty_gpu_frame, empty_host_frame

log, silent_s, future_step = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
later = float(sys.argv[4])  # the detectors look this long after the lines were read
open(log, "w").close()
col, reg, window = make([log])
col.sample_once()  # live from here
now = time.time()
with open(log, "a") as fh:  # Python logging's default %(asctime)s: the host's local time
    for i in range(1, 21):
        t = now - silent_s - (20 - i) * 30.0 + (86400 if i == future_step else 0)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + ",000"
        fh.write(f"{stamp} INFO " + line(i, total=30.0))
col.sample_once()
steps, gpu, host, events = window.frames()
ctx = make_context(steps, empty_gpu_frame(), empty_host_frame(), events, load_config(),
                   time.time() + later)
print(json.dumps({
    "stalled": [f.evidence for f in detect_stalled(ctx)],
    "last_end_minus_now": steps[-1].end_time - now,
    "bad": reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": log, "reason": "bad_timestamp"}),
}))
"""


def live_stall(tmp_path, tz: str, silent_s: float, future_step: int = 0,
               later: float = 0.0) -> dict:
    import json
    import subprocess
    import sys

    env = {**os.environ, "TZ": tz}
    out = subprocess.run([sys.executable, "-c", LIVE_STALL_SCRIPT, str(tmp_path / "t.log"),
                          str(silent_s), str(future_step), str(later)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("tz", ["EST+05", "JST-09"])
def test_a_healthy_run_with_local_timestamps_is_not_stalled_west_or_east(tmp_path, tz):
    """West of UTC, naive times read as UTC made every step hours old: `stalled` opened at
    once. They are read in the host's zone."""
    got = live_stall(tmp_path, tz, silent_s=1.0)
    assert got["stalled"] == [], got
    assert abs(got["last_end_minus_now"] + 1.0) < 5.0, got


@pytest.mark.slow
@pytest.mark.parametrize("tz", ["EST+05", "JST-09"])
def test_a_real_stall_with_local_timestamps_is_flagged_west_or_east(tmp_path, tz):
    """East of UTC, naive times read as UTC lay in the future: `stalled` never opened."""
    got = live_stall(tmp_path, tz, silent_s=1200.0)
    assert len(got["stalled"]) == 1 and "No new step for 20" in got["stalled"][0], got


@pytest.mark.slow
def test_a_step_dated_in_the_future_is_counted_and_does_not_hide_a_stall(tmp_path):
    """A step dated a day ahead takes its arrival time: 20 minutes of silence after it
    (the detectors looking 20 minutes later) are a stall, not a step still to come."""
    got = live_stall(tmp_path, "UTC0", silent_s=0.0, future_step=20, later=1200.0)
    assert got["bad"] == 1, got
    assert abs(got["last_end_minus_now"]) < 5.0, got
    assert len(got["stalled"]) == 1 and "after step 20" in got["stalled"][0], got


def test_a_dated_backlog_longer_than_one_poll_keeps_its_own_times(tmp_path):
    """A log too big for one poll: the later polls still read the backlog, whose old
    (but right) timestamps are not taken for a wrong clock."""
    log = tmp_path / "train.log"
    start = time.time() - 3 * 3600  # three hours ago, a step every 30 s
    log.write_text("".join(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start + 30 * i))
                           + ",000 INFO " + line(i) for i in range(1, 201)))
    col, reg, window = make([log])
    col.logs[0].follower.max_poll_bytes = 8192  # a few polls to read it all
    for _ in range(20):
        col.sample_once()
    steps = window.frames()[0]
    assert len(steps) == 200 and {s.time_source for s in steps} == {"line"}
    assert reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": str(log), "reason": "bad_timestamp"}) == 0


def test_lines_from_before_the_capture_end_before_the_captured_ones(tmp_path):
    """An older run's lines (no capture times) and this run's (captured by run): the older
    ones are rebuilt to end before the first capture."""
    from monitor.logs.arrivals import ArrivalWriter

    log = tmp_path / "train.log"
    old = "".join(line(i) for i in range(1, 4))
    log.write_text(old + "".join(line(i, gen=11.0) for i in range(1, 3)))
    writer = ArrivalWriter(log)
    writer.record(len(old.encode()), 1_700_000_000.0, end=log.stat().st_size)  # one chunk
    writer.close()
    run_exporter(tmp_path, [log])
    steps, _ = stored_steps(tmp_path)
    rebuilt = [s.end_time for s in steps if s.time_source == "rebuilt"]
    captured = [s.end_time for s in steps if s.time_source == "arrival"]
    assert len(rebuilt) == 3 and captured == [1_700_000_000.0] * 2
    assert rebuilt == sorted(rebuilt) and rebuilt[-1] <= 1_700_000_000.0


def test_lines_printed_after_runs_last_capture_never_end_before_it(tmp_path):
    """The exporter's first poll came between the job's write and ``verl-monitor run``'s next
    capture (a loaded machine): ``run`` had captured the job's first line only. The steps past
    its last record were printed after that capture; they were dated at the job's start (by
    the first capture), which moved step 1's work into the wait between steps."""
    from monitor.logs.arrivals import ArrivalWriter

    log = tmp_path / "train.log"
    head = "(TaskRunner pid=11) TaskRunner hostname: n0, PID: 11\n"
    log.write_text(head + "".join(line(i, total=0.4) for i in range(1, 4)))
    started = time.time() - 1.5
    writer = ArrivalWriter(log)
    writer.record(0, started, end=len(head.encode()))  # run's one capture: the first line
    writer.close()
    before = time.time()
    run_exporter(tmp_path, [log])
    steps, _ = stored_steps(tmp_path)
    ends = [s.end_time for s in steps]
    assert len(ends) == 3 and ends == sorted(ends)
    assert all(started < t <= before + 1.0 for t in ends), (started, ends)
    # the last one ends when the log was last written, each before it a step earlier
    assert ends[-1] == pytest.approx(log.stat().st_mtime, abs=0.01)
    assert ends[-1] - ends[0] == pytest.approx(0.8, abs=0.01)


def test_an_old_log_followed_from_its_start_keeps_its_dates(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"2023-05-01T10:00:{i * 10:02d}Z " + line(i) for i in range(1, 4)))
    col, reg, window = make([log])
    col.sample_once()
    assert [s.time_source for s in window.frames()[0]] == ["line"] * 3
    assert reg.get_sample_value("verlmon_log_anomalies_total",
                                {"log": str(log), "reason": "bad_timestamp"}) == 0
