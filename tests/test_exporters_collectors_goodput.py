"""Goodput collector: a real recording fed through the exporter's rolling window."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.registry import load_all
from monitor.analysis.goodput import CAUSES
from monitor.frames import read_gpu_frame
from monitor.live import ViewContext
from monitor.live.goodput_counter import GPU_SECONDS, GoodputCollector
from monitor.live.live_monitor import Recorder
from monitor.live.rolling_window import RollingWindow
from monitor.logs.canonical_records import parse_file

RUN = Path(__file__).parent / "fixtures" / "real_gpu" / "2gpu_straggler"


def _setup():
    steps = parse_file(str(RUN / "train.jsonl")).steps
    gpu = read_gpu_frame(RUN / "gpu.csv")
    end = float(gpu["ts"].max())
    window = RollingWindow(clock=lambda: end + 1.0)
    ctx = ViewContext(node="gpu-node", interval=1.0, sink=Recorder(window), window=window)
    collector = GoodputCollector(ctx)
    reg = CollectorRegistry()
    reg.register(collector)
    rows = gpu.astype({"gpu": int}).to_dict("records")
    return steps, rows, window, collector, reg, end


def _waited(steps) -> float:
    """What GPU 0 waits in all: the growth of update_actor on steps 4-7, where GPU 1 does 2.5x
    the update work, over the clean steps' median."""
    upd = {s.step: s.phases["update_actor"] for s in steps}
    clean = sorted(upd[s] for s in (2, 3, 8))[1]
    return sum(upd[s] - clean for s in (4, 5, 6, 7))


def _value(reg, cause, gpu):
    return reg.get_sample_value(GPU_SECONDS, {"cause": cause, "node": "gpu-node",
                                              "gpu": str(gpu)})


def test_the_counter_adds_up_per_gpu_and_charges_the_waiting_gpu():
    steps, rows, window, collector, reg, end = _setup()
    assert _value(reg, "productive", 0) is None  # nothing before the first step
    window.add_gpu(rows)
    window.add_steps(steps)
    assert collector.poll(now=end) == len(steps)
    first = min(s.end_time - s.total for s in steps)
    wall = max(s.end_time for s in steps) - first
    for g in (0, 1):
        total = sum(_value(reg, c, g) for c in CAUSES)
        assert total == pytest.approx(wall, rel=0.02)
    assert _value(reg, "straggler_wait", 0) > 0.7 * _waited(steps)
    assert _value(reg, "straggler_wait", 1) < 1.0
    assert _value(reg, "restarts", 0) == 0.0  # every cause exported from 0
    # nothing new: nothing counted twice
    before = _value(reg, "productive", 0)
    assert collector.poll(now=end) == 0
    assert _value(reg, "productive", 0) == before


@pytest.mark.slow
def test_steps_arriving_one_by_one_give_the_same_wall_as_all_at_once():
    steps, rows, window, collector, reg, end = _setup()
    window.add_gpu(rows)
    for s in steps:
        window.add_steps([s])
        collector.poll(now=end)
    first = min(s.end_time - s.total for s in steps)
    wall = max(s.end_time for s in steps) - first
    for g in (0, 1):
        assert sum(_value(reg, c, g) for c in CAUSES) == pytest.approx(wall, rel=0.02)
    assert _value(reg, "straggler_wait", 0) > 0.7 * _waited(steps)


def test_a_step_past_the_last_sample_waits_for_its_samples():
    steps, rows, window, collector, reg, end = _setup()
    last = max(s.end_time for s in steps)
    window.add_gpu([r for r in rows if r["ts"] < last - 3.0])
    window.add_steps(steps)
    assert collector.poll(now=last + 1.0) == len(steps) - 1
    assert collector.poll(now=last + 60.0) == 1  # counted anyway after the wait


def test_the_collector_registers_itself():
    assert "goodput" in load_all()


def test_the_printed_config_books_gen_as_waiting_for_samples():
    """The job's printed config reaches the counter through its ViewContext (the live
    monitor's JobConfigWatch): on verl 0.9's V1 separate-async trainer, whose keys read as the
    sync trainer's, ``gen`` is the trainer waiting for samples, as ``analyze`` books it."""
    v1 = {"trainer": {"use_v1": True, "v1": {"trainer_mode": "separate_async"}}}
    steps, rows, _, _, _, end = _setup()
    waited = {}
    for told in (None, v1):
        window = RollingWindow(clock=lambda: end + 1.0)
        collector = GoodputCollector(ViewContext(node="gpu-node", interval=1.0, window=window,
                                                 job_config=lambda told=told: told))
        reg = CollectorRegistry()
        reg.register(collector)
        window.add_gpu(rows)
        window.add_steps(steps)
        assert collector.poll(now=end) == len(steps)
        waited[told is not None] = sum(_value(reg, "waiting_for_samples", g) for g in (0, 1))
    gen = sum(s.phases["gen"] for s in steps)
    assert waited[False] == 0.0
    assert waited[True] == pytest.approx(2 * gen, rel=0.1)


def test_the_store_keeps_the_ledger_counted_and_the_steps_are_counted_from_zero(tmp_path):
    """The seconds behind ``verlmon_gpu_seconds_total`` reach the run store row by row, and
    ``verlmon_goodput_steps_total`` counts the steps from 0: the dashboard on the store and on
    Prometheus read one ledger (issue 38 item 1)."""
    from monitor.store import RunStore, StoreWriter

    steps, rows, window, collector, reg, end = _setup()
    store = RunStore(tmp_path / "run.db")
    writer = StoreWriter(store, compact_interval_s=None)
    collector.ctx.sink.store = writer
    steps_total = "verlmon_goodput_steps_total"
    assert reg.get_sample_value(steps_total, {"node": "gpu-node"}) == 0.0  # before any step
    window.add_gpu(rows)
    window.add_steps(steps)
    assert collector.poll(now=end) == len(steps)
    assert writer.flush()
    assert reg.get_sample_value(steps_total, {"node": "gpu-node"}) == len(steps)
    kept = store.ledger()
    assert len(kept) == 2 * len(steps) and set(kept["gpu"]) == {0, 1}
    for cause in CAUSES:
        for g in (0, 1):
            assert kept.loc[kept["gpu"] == g, cause].sum() == pytest.approx(
                _value(reg, cause, g), abs=1e-3), (cause, g)
    store.close()
