"""LiveMonitor across restarts (real SQLite store, real detectors, the Slack outbox in the
store): flags survive their process, one "opened" and one "resolved" per flag; detector
exceptions are counted."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from exporters.options import ExporterOptions
from monitor.detect import DETECTORS
from monitor.live.live_monitor import CLOSED_AT_RESTART, LiveMonitor
from monitor.records import Event, Flag, StepRecord
from monitor.store import RunStore

T0 = time.time() - 230.0  # the last step below ends 20 s ago: nothing stalls


@pytest.fixture(autouse=True)
def _fresh_clock():
    """T0 again for each test: in a long suite the module is imported half an hour before
    its tests run, and steps that ended then would read as a stall."""
    global T0
    T0 = time.time() - 230.0


def steps(first: int, last: int, throughput: float) -> list[StepRecord]:
    return [StepRecord(step=i, end_time=T0 + 10.0 * i, total=10.0,
                       phases={"gen": 6.0, "update_actor": 3.0}, throughput=throughput,
                       metrics={"timing_s/step": 10.0, "perf/throughput": throughput},
                       source="console")
            for i in range(first, last + 1)]


def monitor(tmp_path: Path) -> LiveMonitor:
    hook = tmp_path / "hook"
    hook.write_text("http://127.0.0.1:9/services/T000/B000/none\n")  # never delivered here
    mon = LiveMonitor(ExporterOptions(store=str(tmp_path / "run.db"),
                                      slack_webhook_file=str(hook)), node="n0", interval=1.0)
    mon.open()
    return mon


def close(mon: LiveMonitor) -> None:
    """Flush and close like a process killed right after its last flush."""
    assert mon.store is not None and mon.store.flush()
    mon.run_store.close()
    mon._store_lock.release()


def queued(tmp_path: Path) -> list[str]:
    with RunStore(tmp_path / "run.db") as store:
        return [i.dedupe_key for i in store.outbox_pending()]


def test_a_flag_survives_restarts_with_one_opened_and_one_resolved(tmp_path):
    first = monitor(tmp_path)
    first.add_steps(steps(1, 12, 1000.0) + steps(13, 16, 700.0))
    opened, _ = first.detect_once()
    assert [f.kind for f in opened] == ["throughput_regression"]
    start = opened[0].start
    close(first)
    for _ in range(2):  # killed and started again, twice, while the flag is still true
        again = monitor(tmp_path)
        assert again.adopted_flags == 1
        opened, closed = again.detect_once()
        assert opened == [] and closed == []
        close(again)
    last = monitor(tmp_path)
    last.add_steps(steps(17, 21, 1000.0))  # recovered
    _, closed = last.detect_once()
    assert [(f.kind, f.start) for f in closed] == [("throughput_regression", start)]
    close(last)
    with RunStore(tmp_path / "run.db") as store:
        rows = [f for f in store.flags() if f.kind == "throughput_regression"]
    assert len(rows) == 1 and rows[0].end is not None and rows[0].start == start
    keys = [k for k in queued(tmp_path) if k.startswith("throughput_regression")]
    assert [k.rsplit("|", 1)[1] for k in keys] == ["opened", "resolved"]


def test_an_adopted_flag_no_longer_true_closes_with_the_reason(tmp_path):
    with RunStore(tmp_path / "run.db") as store:
        store.upsert_flags([Flag("gpu_fault", "critical", T0, None, {"node": "n0", "gpus": [2]},
                                 "GPU 2 reported XID 79")])
    mon = monitor(tmp_path)
    assert mon.adopted_flags == 1
    mon.add_steps(steps(20, 22, 1000.0))
    _, closed = mon.detect_once()
    assert [f.kind for f in closed] == ["gpu_fault"]
    assert closed[0].evidence.endswith(f"({CLOSED_AT_RESTART})")
    close(mon)
    with RunStore(tmp_path / "run.db") as store:
        (flag,) = store.flags()
    assert flag.end is not None and CLOSED_AT_RESTART in flag.evidence
    assert [k.rsplit("|", 1)[1] for k in queued(tmp_path)] == ["resolved"]


def test_detector_exceptions_are_counted_by_detector_and_logged_once(tmp_path, monkeypatch,
                                                                      caplog):
    def broken(ctx):
        raise RuntimeError("bad frame")

    monkeypatch.setitem(DETECTORS, "broken", broken)
    mon = LiveMonitor(ExporterOptions(), node="n0", interval=1.0)
    mon.open()
    mon.add_steps(steps(1, 3, 1000.0))
    with caplog.at_level(logging.WARNING, logger="verl_monitor.exporter"):
        for _ in range(3):
            mon.detect_once()
    assert mon.detector_errors == {"broken": 3}
    said = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert len(said) == 1 and "bad frame" in said[0] and "\n" not in said[0]
    families = {f.name: f for f in mon.health_families()}
    samples = families["verlmon_detector_errors"].samples
    assert [(s.labels, s.value) for s in samples] == [({"detector": "broken"}, 3.0)]


def test_an_oom_followed_by_a_flood_of_other_events_still_opens_and_posts(tmp_path):
    mon = monitor(tmp_path)
    now = time.time()
    mon.add_steps(steps(20, 22, 1000.0))
    mon.add_events([Event("oom", now - 5.0, 22, "torch.OutOfMemoryError: CUDA out of memory")])
    mon.add_events([Event("progress", now - 4.0 + i * 1e-3, None, f"Training Progress {i}")
                    for i in range(1500)])
    opened, _ = mon.detect_once()
    assert "oom" in [f.kind for f in opened]
    assert mon.window.dropped["events"] == 501
    families = {f.name: f for f in mon.health_families()}
    evicted = [s.value for s in families["verlmon_window_dropped_rows"].samples
               if s.labels == {"kind": "events"}]
    assert evicted == [501.0]
    close(mon)
    assert any(k.startswith("oom|") and k.endswith("|opened") for k in queued(tmp_path))


def test_a_restart_refills_the_window_with_every_kind_of_sample(tmp_path):
    """The rollout engines' rows come back after a restart too (the engine detectors judge
    KV-cache pressure over minutes), not only GPU, host and NCCL rows."""
    first = monitor(tmp_path)
    first.add_steps(steps(1, 3, 1000.0))
    first.add_gpu([{"ts": T0 + 25.0, "node": "n0", "gpu": 0, "util": 90.0, "sm_active": 70.0}])
    first.add_rollout([{"ts": T0 + 1.0 + i, "node": "n0", "server": "127.0.0.1:8000",
                        "engine": "vllm", "model": "m", "kv_cache_usage": 0.9, "running": 8,
                        "waiting": 4, "preemptions_total": float(i)} for i in range(3)])
    close(first)
    second = monitor(tmp_path)
    try:
        assert second.window.rollout()["preemptions_total"].tolist() == [0.0, 1.0, 2.0]
        assert len(second.window.frame("gpu")) == 1
        with RunStore(tmp_path / "run.db") as store:
            assert store.counts()["rollout_samples"] == 3
            assert store.time_range()[0] == pytest.approx(T0 + 1.0)  # the first engine row
    finally:
        close(second)
