"""Host collector on this machine: sane values, host rows, the training process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from prometheus_client import CollectorRegistry

from exporters.collectors.host import HostCollector, trainer_candidates
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext
from monitor.live.live_monitor import Recorder
from monitor.live.rolling_window import RollingWindow

TRAINER = ("import subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'x = bytearray(32 << 20)\\n"
           "import time\\nt = time.time()\\nwhile time.time() - t < 60: pass'])\n"
           "time.sleep(60)\n")


@pytest.fixture
def trainer():
    """A stand-in trainer: its command line names main_ppo; its child burns CPU."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, "verl/trainer/main_ppo.py"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait(timeout=10)


def make(options=None):
    window = RollingWindow()
    ctx = ExporterContext(node="n0", interval=1.0, sink=Recorder(window),
                          options=options or ExporterOptions())
    col = HostCollector(ctx)
    reg = CollectorRegistry()
    reg.register(col)
    return col, reg, window


def test_values_are_sane_and_a_host_row_is_recorded():
    col, reg, window = make()
    assert col.sample_once()
    # one sample gives no CPU delta yet: those series are absent, not zero
    assert reg.get_sample_value("verlmon_host_cpu_average_ratio") is None
    total = reg.get_sample_value("verlmon_host_memory_total_bytes")
    used = reg.get_sample_value("verlmon_host_memory_used_bytes")
    assert total == psutil.virtual_memory().total
    assert 0 < used <= total
    read0 = reg.get_sample_value("verlmon_host_disk_read_bytes_total")
    time.sleep(0.2)
    assert col.sample_once()
    for name in ("verlmon_host_cpu_max_core_ratio", "verlmon_host_cpu_average_ratio",
                 "verlmon_host_cpu_iowait_ratio"):
        assert 0.0 <= reg.get_sample_value(name) <= 1.0, name
    # the busiest core is never below the average (1e-9: float rounding when cores are equal)
    assert reg.get_sample_value("verlmon_host_cpu_max_core_ratio") >= \
        reg.get_sample_value("verlmon_host_cpu_average_ratio") - 1e-9
    if read0 is not None:
        assert reg.get_sample_value("verlmon_host_disk_read_bytes_total") >= read0
    _, _, host, _ = window.frames()
    assert len(host) == 1
    row = host.iloc[0]
    assert row["node"] == "n0"
    assert 0 <= row["cpu_avg_pct"] <= 100 and row["cpu_max_core_pct"] >= row["cpu_avg_pct"]


@pytest.mark.slow
def test_training_process_tree_by_pid(trainer):
    col, reg, _ = make(ExporterOptions(train_pid=trainer.pid))
    col.sample_once()
    time.sleep(0.3)
    col.sample_once()
    rss = reg.get_sample_value("verlmon_training_process_resident_bytes")
    assert rss is not None and rss > 32 << 20  # the child's 32 MiB buffer counts
    cpu = reg.get_sample_value("verlmon_training_process_cpu_ratio")
    assert cpu is not None and cpu > 0  # the child's busy loop is in the tree
    assert col.snapshot.train_pid == trainer.pid


@pytest.mark.slow
def test_the_host_rows_carry_the_training_trees_resident_memory(trainer):
    # issue 23: memory_creep judges the workers' host memory from these rows (store, host.csv)
    col, reg, window = make(ExporterOptions(train_pid=trainer.pid))
    col.sample_once()
    time.sleep(0.3)
    col.sample_once()
    _, _, host, _ = window.frames()
    rss = host["train_rss_bytes"].dropna()
    assert len(rss) >= 1 and rss.iloc[-1] > 32 << 20
    assert rss.iloc[-1] == reg.get_sample_value("verlmon_training_process_resident_bytes")


@pytest.mark.slow
def test_trainer_found_by_command_line(trainer):
    pids = {p.pid for p in trainer_candidates(exclude={os.getpid()})}
    assert trainer.pid in pids
    assert os.getpid() not in pids
    # with a memo of non-matching processes, the trainer is still found on every scan
    checked: set[int] = set()
    for _ in range(2):
        assert trainer.pid in {p.pid for p in trainer_candidates({os.getpid()}, checked)}
    assert trainer.pid not in checked and len(checked) > 0


def test_no_trainer_means_absent_series():
    col, reg, _ = make(ExporterOptions(train_pid=2**22 + 12345))  # no such process
    col.sample_once()
    col.sample_once()
    assert reg.get_sample_value("verlmon_training_process_cpu_ratio") is None
    assert reg.get_sample_value("verlmon_training_process_resident_bytes") is None


def test_simulated_gpus_bring_the_scenarios_host_signature():
    """With the sim GPU backend the host CPU series are the scenario's, not this machine's:
    during io_starvation the dataloader core is pegged, in Prometheus and in the window."""
    from exporters.gpu.sim import SimBackend
    from monitor.sim.engine import SimRun

    run = SimRun("io_starvation", steps=30, gpus_per_node=2, seed=1)
    problem = next(t for t in run.truth if t["kind"] == "io_starvation")
    mid = (problem["start"] + (problem["end"] or run.end_time)) / 2
    backend = SimBackend(run=run, clock=lambda: run.start_time)
    backend._t0 = run.start_time - (mid - run.start_time)  # clock sits mid-problem
    window = RollingWindow()
    ctx = ExporterContext(node="node0", interval=1.0, sink=Recorder(window), gpu_backend=backend)
    col = HostCollector(ctx)
    reg = CollectorRegistry()
    reg.register(col)
    assert col.sample_once() and col.sample_once()
    expected = run.host_sample_at(mid, "node0")["cpu_max_core_pct"] / 100.0
    assert expected > 0.9  # the scenario pegs a core
    assert reg.get_sample_value("verlmon_host_cpu_max_core_ratio") == pytest.approx(expected)
    _, _, host_df, _ = window.frames()
    assert host_df["cpu_max_core_pct"].iloc[-1] == pytest.approx(expected * 100.0)


def test_a_failing_simulated_host_sample_is_a_failed_round_logged_once(caplog):
    """The sim backend's host row fails (a node the run does not have): the collector shows
    it as a failure (unhealthy: success 0; counted; the words once in the log), keeps this
    machine's readings, and says once that it works again when the row comes back."""
    import logging

    from exporters.exposition import Exposition
    from exporters.gpu.sim import SimBackend
    from monitor.sim.engine import SimRun

    run = SimRun("healthy", steps=5, gpus_per_node=2, seed=1)
    backend = SimBackend(run=run, clock=lambda: run.start_time)
    ctx = ExporterContext(node="node0", interval=1.0, sink=Recorder(RollingWindow()),
                          gpu_backend=backend)
    col = HostCollector(ctx)
    reg = CollectorRegistry()
    reg.register(Exposition({"host": col}, node="node0", version="t"))
    backend.node = "node7"  # the run has node0 only: host_sample raises KeyError
    with caplog.at_level(logging.INFO, logger="verl_monitor.exporter"):
        for _ in range(3):
            assert not col.sample_once()
            assert reg.get_sample_value("verlmon_collector_success", {"collector": "host"}) == 0
        assert "unknown node 'node7'" in col.last_error
        assert col.errors == 3
        assert reg.get_sample_value("verlmon_collector_errors_total",
                                    {"collector": "host"}) == 3
        assert col.snapshot.mem_total == psutil.virtual_memory().total  # the rest is kept
        backend.node = "node0"
        assert col.sample_once()
        assert col.sample_once()
    assert reg.get_sample_value("verlmon_collector_success", {"collector": "host"}) == 1
    assert col.last_error is None and col.snapshot.extra.get("simulated")
    said = [r for r in caplog.records if "collector host" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO], said
    assert "simulated host sample failed" in said[0].getMessage()
    assert "node7" in said[0].getMessage()
    assert said[1].getMessage().endswith("sampling works again")
