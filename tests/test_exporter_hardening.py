"""The exporter's threads and store under failure (issue 12): supervised threads restart and
count it, store_up follows failing writes, errors are logged once per episode, one exporter per
store, the node name is never overwritten, every drop is counted in /metrics."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest

from cli.commands.exporter import parse_options
from exporters.node_exporter import Exporter, ExporterError
from monitor.live import live_monitor as monitor_mod
from monitor.live.live_monitor import supervised
from monitor.records import StepRecord
from monitor.store import RunStore


def value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def options(tmp_path, *extra: str):
    return parse_options(["--listen-address", "127.0.0.1:0", "--interval", "0.2",
                          "--gpu-backend", "sim", "--scenario", "healthy", "--sim-gpus", "2",
                          "--store", str(tmp_path / "run.db"), "--node", "n-a",
                          "--no-collector.host", *extra])


def test_supervised_thread_restarts_and_logs_each_reason_once(caplog):
    calls, restarts, stop = [], {}, threading.Event()

    def target():
        calls.append(1)
        if len(calls) >= 4:
            stop.set()
            return
        raise RuntimeError("boom")

    monitor_mod.RESTART_PAUSE_S, saved = 0.01, monitor_mod.RESTART_PAUSE_S
    try:
        with caplog.at_level(logging.ERROR, logger="verl_monitor.exporter"):
            supervised("worker", target, stop, restarts)
    finally:
        monitor_mod.RESTART_PAUSE_S = saved
    assert len(calls) == 4 and restarts == {"worker": 3}
    assert [r.getMessage() for r in caplog.records] == [
        "thread worker failed (RuntimeError: boom); restarting it"]


@pytest.mark.slow
def test_a_dying_flusher_is_restarted_counted_and_store_up_follows_writes(tmp_path, caplog):
    """Before: the store-flusher died on the first OverflowError and /metrics kept saying
    store_up 1 with 0 write errors."""
    exporter = Exporter(options(tmp_path))
    exporter.start()
    try:
        real_flush = exporter.monitor.store.flush
        broken = {"left": 2}

        def flaky_flush():
            if broken["left"]:
                broken["left"] -= 1
                raise OverflowError("Python int too large to convert to SQLite INTEGER")
            return real_flush()

        exporter.monitor.store.flush = flaky_flush
        text = wait_for(lambda: (t := httpx.get(exporter.url, timeout=10).text) and value(
            t, 'verlmon_exporter_thread_restarts_total{thread="store-flusher"}') == 2 and t)
        assert value(text, "verlmon_store_up") == 1.0
        assert text.count('verlmon_exporter_thread_restarts_total{thread="store-flusher"}') == 1
        # a store that refuses writes (its page cap reached): store_up 0, errors counting
        with caplog.at_level(logging.INFO, logger="verl_monitor.exporter"):
            exporter.monitor.run_store.set_page_limit(
                exporter.monitor.run_store._conn().execute("PRAGMA page_count").fetchone()[0])
            exporter.monitor.store.put_steps([StepRecord(step=i, end_time=float(i), total=1.0,
                                                 metrics={"pad": "x" * 4000})
                                      for i in range(200)])
            text = wait_for(lambda: (t := httpx.get(exporter.url, timeout=10).text) and value(
                t, "verlmon_store_write_errors_total") >= 3 and t)
            assert value(text, "verlmon_store_up") == 0.0
            full = [r for r in caplog.records if "disk" in r.getMessage()]
            assert len(full) == 1  # once per episode, not every second
            exporter.monitor.run_store.set_page_limit(None)
            wait_for(lambda: value(httpx.get(exporter.url, timeout=10).text,
                                   "verlmon_store_up") == 1.0)
            wait_for(lambda: any("writes work again" in r.getMessage()
                                 for r in caplog.records))
        # a step past 64 bits: dropped and counted, the store stays up
        exporter.monitor.store.put_steps([StepRecord(step=2**63, end_time=1.0, total=1.0)])
        text = httpx.get(exporter.url, timeout=10).text
        assert value(text, 'verlmon_store_dropped_rows_total{reason="invalid"}') == 1.0
        assert value(text, 'verlmon_window_dropped_rows_total{kind="gpu"}') == 0.0
    finally:
        exporter.stop()
    store = RunStore(tmp_path / "run.db", create=False)
    assert store.counts()["steps"] == 200
    store.close()


def test_a_second_exporter_on_the_store_is_refused_and_the_node_name_kept(tmp_path):
    """Before: a second exporter doubled every row and overwrote the node name."""
    first = Exporter(options(tmp_path))
    first.start()
    try:
        with pytest.raises(ExporterError) as info:
            Exporter(options(tmp_path, "--node", "n-b")).start()
        message = str(info.value)
        assert "another exporter" in message and "pid" in message and "\n" not in message
    finally:
        first.stop()
    with pytest.raises(ExporterError, match="holds node n-a's run"):
        Exporter(options(tmp_path, "--node", "n-b")).start()
    store = RunStore(tmp_path / "run.db", create=False)
    assert store.meta()["node"] == "n-a"
    store.close()
    again = Exporter(options(tmp_path))  # the same node after a stop: fine
    again.start()
    again.stop()


def test_the_window_says_when_it_cannot_hold_the_window(tmp_path, caplog):
    opts = options(tmp_path, "--window", "1800")
    exporter = Exporter(opts)
    rows = exporter.monitor.window._rows  # the window's rows by telemetry kind
    rows["gpu"] = type(rows["gpu"])(maxlen=1000)  # 1000 rows: 100 s of 2 GPUs
    with caplog.at_level(logging.WARNING, logger="verl_monitor.exporter"):
        exporter.start()
    exporter.stop()
    lines = [r.getMessage() for r in caplog.records if "window holds" in r.getMessage()]
    assert lines == ["the detectors' window holds 1000 GPU rows: 1.7 min of 2 GPUs every 0.2 "
                     "s, not --window's 30 min; older rows are dropped (counted in "
                     "verlmon_window_dropped_rows_total)"]


def test_oversize_log_lines_are_counted_in_metrics(tmp_path):
    from monitor.logs import follow

    log = tmp_path / "train.log"
    log.write_text("")
    exporter = Exporter(options(tmp_path, "--log", str(log)))
    exporter.start()
    try:
        for followed in exporter.collectors["verl_log"].logs:
            followed.follower._splitter.max_line_bytes = 1000  # 16 MiB in real life
        with log.open("a") as fh:
            fh.write("x" * 5000 + "\nstep:1 - timing_s/step:10\n")
        series = f'verlmon_log_dropped_lines_total{{log="{log}"}}'
        text = wait_for(lambda: (t := httpx.get(exporter.url, timeout=10).text) and value(
            t, series) == 1.0 and t)
        assert value(text, "verlmon_training_step") == 1.0
        assert follow.MAX_LINE_BYTES == 16 * 2**20
    finally:
        exporter.stop()


def test_a_store_with_garbage_inside_is_reported_down(tmp_path, caplog):
    """Before: a store with garbage mid-file opened with store_up 1."""
    import os

    from monitor.store import StoreWriter

    path = tmp_path / "run.db"
    store = RunStore(path)
    writer = StoreWriter(store)
    writer.put_gpu([{"ts": float(i), "node": "n-a", "gpu": 0, "util": 1.0}
                    for i in range(20_000)])
    assert writer.flush()
    store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.seek(size // 2 - (size // 2) % 4096)
        fh.write(os.urandom(3 * 4096))
    exporter = Exporter(options(tmp_path))
    with caplog.at_level(logging.ERROR, logger="verl_monitor.exporter"):
        exporter.start()
        try:
            wait_for(lambda: value(httpx.get(exporter.url, timeout=10).text,
                                   "verlmon_store_up") == 0.0)
            wait_for(lambda: any("integrity check" in r.getMessage() for r in caplog.records))
        finally:
            exporter.stop()
