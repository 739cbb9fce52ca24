"""RunStore: writing and reading back every kind of record, WAL readers in another process."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.frames import GPU_COLUMNS, HOST_COLUMNS
from monitor.logs.follow import LogPosition
from monitor.records import Event, Flag, StepRecord
from monitor.store import NCCL_COLUMNS, RunStore, StoreError


def gpu_rows(t0: float, seconds: int, gpus: int = 8, node: str = "n0") -> list[dict]:
    return [
        {
            "ts": t0 + i,
            "node": node,
            "gpu": g,
            "util": float((i + g) % 100),
            "sm_active": float("nan") if g == 7 else 50.0,
            "mem_used_bytes": 1e9 * (g + 1),
            "mem_total_bytes": 80e9,
            "power_w": 300.0,
        }
        for i in range(seconds)
        for g in range(gpus)
    ]


@pytest.fixture
def store(tmp_path: Path):
    s = RunStore(tmp_path / "run.db")
    yield s
    s.close()


def test_gpu_samples_round_trip_with_filters(store: RunStore) -> None:
    store.add_gpu_samples(gpu_rows(1000.0, 10))
    store.add_gpu_samples(gpu_rows(1000.0, 10, gpus=2, node="n1"))
    df = store.gpu_frame()
    assert list(df.columns) == list(GPU_COLUMNS)
    assert len(df) == 100
    assert df["ts"].is_monotonic_increasing
    # NaN (unknown SM activity) comes back as NaN, not 0
    assert df[df["gpu"] == 7]["sm_active"].isna().all()
    assert (df[df["gpu"] == 0]["sm_active"] == 50.0).all()
    assert df["tensor_active"].isna().all()
    window = store.gpu_frame(start=1002.0, end=1004.0, node="n1")
    assert sorted(window["ts"].unique()) == [1002.0, 1003.0, 1004.0]
    assert set(window["node"]) == {"n1"} and len(window) == 6


def test_host_and_nccl_frames(store: RunStore) -> None:
    store.add_host_samples(
        [{"ts": 5.0, "node": "n0", "cpu_max_core_pct": 100.0, "cpu_avg_pct": 12.5}]
    )
    store.add_nccl_samples(
        [{"ts": 6.0, "node": "n0", "coll": "AllReduce", "comm": "0xab", "ops": 3,
          "bytes": 1e6, "exec_s": 0.01, "busbw_bps": 2e11}]
    )
    host = store.host_frame()
    assert list(host.columns) == list(HOST_COLUMNS)
    assert host.iloc[0]["cpu_max_core_pct"] == 100.0 and math.isnan(host.iloc[0]["iowait_pct"])
    nccl = store.nccl_frame()
    assert list(nccl.columns) == list(NCCL_COLUMNS)
    assert nccl.iloc[0]["coll"] == "AllReduce" and nccl.iloc[0]["busbw_bps"] == 2e11
    assert store.time_range() == (5.0, 6.0)


def test_empty_store_reads_empty(store: RunStore) -> None:
    assert store.gpu_frame().empty and list(store.gpu_frame().columns) == list(GPU_COLUMNS)
    assert store.host_frame().empty
    assert store.steps() == [] and store.events() == [] and store.flags() == []
    assert store.time_range() == (None, None)


def test_steps_are_idempotent_per_step_and_end_time(store: RunStore) -> None:
    s1 = StepRecord(step=1, end_time=100.0, total=10.0, phases={"gen": 6.0, "reshard": 1.5},
                    throughput=1234.5, metrics={"timing_s/gen": 6.0, "actor/lr": float("nan")},
                    time_source="line", source="jsonl")
    store.add_steps([s1])
    store.add_steps([s1])  # the exporter re-reading the same line
    resumed = StepRecord(step=1, end_time=500.0, total=11.0, phases={"gen": 7.0})
    store.add_steps([resumed])
    got = store.steps()
    assert [(s.step, s.end_time) for s in got] == [(1, 100.0), (1, 500.0)]
    first = got[0]
    assert first.phases == {"gen": 6.0, "reshard": 1.5}
    assert first.throughput == 1234.5 and first.time_source == "line" and first.source == "jsonl"
    assert math.isnan(first.metrics["actor/lr"])
    assert [s.end_time for s in store.steps(start=200.0)] == [500.0]


def test_step_without_end_time_is_kept_once(store: RunStore) -> None:
    s = StepRecord(step=3, end_time=None, total=2.0)
    store.add_steps([s, s])
    assert [x.step for x in store.steps()] == [3]


def test_events_duplicates_dropped(store: RunStore) -> None:
    oom = Event(kind="oom", time=50.0, step=4, message="CUDA out of memory", data={"gb": 2})
    store.add_events([oom, Event(kind="resume", time=60.0, step=2)])
    store.add_events([oom])
    got = store.events()
    assert [e.kind for e in got] == ["oom", "resume"]
    assert got[0].data == {"gb": 2} and got[0].step == 4
    assert [e.kind for e in store.events(kind="resume")] == ["resume"]


def test_flags_upsert_by_kind_scope_start(store: RunStore) -> None:
    open_flag = Flag(kind="gpu_imbalance", severity="warning", start=100.0, end=None,
                     scope={"node": "n0", "gpus": [3]}, evidence="gpu 3 at 40%",
                     advice=["set actor_rollout_ref.actor.use_dynamic_bsz=True"])
    other = Flag(kind="gpu_imbalance", severity="warning", start=100.0, end=None,
                 scope={"node": "n0", "gpus": [5]}, evidence="gpu 5 at 41%")
    store.upsert_flags([open_flag, other])
    assert len(store.flags(active_only=True)) == 2
    closed = Flag(**{**open_flag.to_dict(), "end": 180.0, "severity": "critical"})
    store.upsert_flags([closed])
    flags = store.flags()
    assert len(flags) == 2
    f3 = next(f for f in flags if f.scope["gpus"] == [3])
    assert f3.end == 180.0 and f3.severity == "critical"
    assert f3.advice == ["set actor_rollout_ref.actor.use_dynamic_bsz=True"]
    assert [f.scope["gpus"] for f in store.flags(active_only=True)] == [[5]]


def test_meta(store: RunStore) -> None:
    store.set_meta("run_name", "grpo-7b")
    store.set_meta("nodes", ["n0", "n1"])
    store.set_meta("run_name", "grpo-7b-b")
    assert store.meta() == {"run_name": "grpo-7b-b", "nodes": ["n0", "n1"]}


def test_batch_is_all_or_nothing(store: RunStore) -> None:
    with pytest.raises(ValueError):
        store.add_batch(gpu=gpu_rows(0.0, 1), host=[{"node": "n0"}])  # host row without ts
    assert store.gpu_frame().empty


def test_missing_file_is_not_created_when_asked_not_to(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="nope.db: no such file"):
        RunStore(tmp_path / "nope.db", create=False)
    assert not (tmp_path / "nope.db").exists()


def test_outbox_queue(store: RunStore) -> None:
    a = store.outbox_add({"text": "a"}, dedupe_key="k1", created=10.0)
    b = store.outbox_add({"text": "b"}, created=11.0)
    assert [i.payload["text"] for i in store.outbox_pending()] == ["a", "b"]
    store.outbox_mark_failed(a, "HTTP 500", next_attempt=100.0)
    assert [i.id for i in store.outbox_pending(now=50.0)] == [b]
    store.outbox_mark_sent(b, 12.0)
    assert store.outbox_count_pending() == 1
    item = store.outbox_pending()[0]
    assert item.attempts == 1 and item.last_error == "HTTP 500"
    assert store.outbox_seen("k1", since=5.0) and not store.outbox_seen("k1", since=10.5)


_READER = """
import sys, time
from monitor.store import RunStore
store = RunStore(sys.argv[1], create=False)
want = int(sys.argv[2])
seen = []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    n = len(store.gpu_frame())
    if not seen or seen[-1] != n:
        seen.append(n)
    if n >= want:
        break
print(" ".join(map(str, seen)))
"""


@pytest.mark.slow
def test_reader_in_other_process_sees_only_whole_batches(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    store = RunStore(path)
    batches = 40
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path), str(batches * 64)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for b in range(batches):
        store.add_gpu_samples(gpu_rows(1000.0 + b * 8, 8))  # 64 rows per transaction
        time.sleep(0.005)
    out, err = proc.communicate(timeout=90)
    store.close()
    assert proc.returncode == 0, err
    seen = [int(x) for x in out.split()]
    assert seen[-1] == batches * 64
    assert all(n % 64 == 0 for n in seen), seen  # never a half-written batch
    assert seen == sorted(seen)


_READ_ONCE = """
import sys
from monitor.store import RunStore
store = RunStore(sys.argv[1], create=False, busy_timeout_s=0.2)
print(len(store.gpu_frame()), len(store.steps()))
"""


@pytest.mark.slow
def test_reader_works_while_writer_holds_a_transaction(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    store = RunStore(path)
    store.add_gpu_samples(gpu_rows(0.0, 2))
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO steps (step, end_key, phases, metrics) VALUES (1, 1, '{}', '{}')")
    try:
        res = subprocess.run([sys.executable, "-c", _READ_ONCE, str(path)],
                             capture_output=True, text=True, timeout=60)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        store.close()
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["16", "0"]


def test_one_writer_thread_and_reader_threads(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run.db")
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                n = len(store.gpu_frame())
                assert n % 8 == 0
                store.steps()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for i in range(100):
        store.add_gpu_samples(gpu_rows(float(i), 1))
        store.add_steps([StepRecord(step=i, end_time=float(i), total=1.0)])
    done.set()
    for t in readers:
        t.join(timeout=30)
    assert not errors
    assert len(store.gpu_frame()) == 800 and len(store.steps()) == 100
    store.close()


def test_resampled_read_for_charts(store: RunStore) -> None:
    store.add_gpu_samples(gpu_rows(1000.0, 60, gpus=2))
    df = store.gpu_frame(resample_s=15.0)
    assert list(df.columns) == list(GPU_COLUMNS)
    assert list(df["ts"].unique()) == [990.0, 1005.0, 1020.0, 1035.0, 1050.0]
    assert len(df) == 5 * 2
    first = df[(df["ts"] == 1005.0) & (df["gpu"] == 1)].iloc[0]
    assert first["util"] == pytest.approx(sum((i + 1) % 100 for i in range(5, 20)) / 15)
    assert first["mem_used_bytes"] == 2e9
    window = store.gpu_frame(start=1010.0, end=1029.0, node="n0", resample_s=60.0)
    assert list(window["ts"]) == [960.0, 960.0, 1020.0, 1020.0]
    assert list(window["gpu"]) == [0, 1, 0, 1]
    with pytest.raises(ValueError):
        store.gpu_frame(resample_s=-1.0)


_value = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=False, width=64))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "ts": st.floats(min_value=0, max_value=2e9, allow_nan=False),
    "node": st.text(min_size=1, max_size=8),
    "gpu": st.integers(min_value=0, max_value=15),
    "util": _value, "sm_active": _value, "mem_used_bytes": _value,
    "mem_total_bytes": _value, "power_w": _value,
}), max_size=30))
def test_gpu_rows_round_trip_exactly(rows: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp, RunStore(Path(tmp) / "r.db") as store:
        store.add_gpu_samples(rows)
        df = store.gpu_frame()
    expected = sorted(rows, key=lambda r: r["ts"])  # stable: equal ts keep insertion order
    assert len(df) == len(expected)
    for got, want in zip(df.to_dict("records"), expected, strict=True):
        assert got["ts"] == want["ts"] and got["node"] == want["node"]
        assert got["gpu"] == want["gpu"]
        for col in ("util", "sm_active", "mem_used_bytes", "mem_total_bytes", "power_w"):
            w = want[col]
            if w is None or math.isnan(w):
                assert math.isnan(got[col])  # missing stays missing, never 0
            else:
                assert got[col] == w


# --- restart safety: positions, one row per step ----------------------------------------------


def _position(offset: int) -> LogPosition:
    return LogPosition("/logs/train.log", 2049, 1234, offset, min(offset, 4096), "ab" * 20)


def test_positions_are_saved_in_the_transaction_of_their_steps(store: RunStore) -> None:
    store.add_batch(steps=[StepRecord(step=1, end_time=1.0)], positions=[_position(100)])
    assert store.log_positions() == {"/logs/train.log": _position(100)}
    with pytest.raises(ValueError):  # a step that cannot be stored: the position stays behind
        store.add_batch(steps=[StepRecord(step=2**64, end_time=2.0)], positions=[_position(200)])
    assert store.log_positions()["/logs/train.log"].offset == 100
    assert [s.step for s in store.steps()] == [1]


def test_a_step_read_again_later_keeps_its_first_row_and_time(store: RunStore) -> None:
    first = StepRecord(step=7, end_time=100.0, total=5.0, metrics={"timing_s/step": 5.0})
    store.add_steps([first])
    again = StepRecord(step=7, end_time=900.0, total=5.0, metrics={"timing_s/step": 5.0})
    store.add_steps([again, again])
    assert [(s.step, s.end_time) for s in store.steps()] == [(7, 100.0)]
    redone = StepRecord(step=7, end_time=950.0, total=5.2, metrics={"timing_s/step": 5.2})
    store.add_steps([redone])  # a true resume: the step ran again and logged other values
    assert [(s.step, s.end_time) for s in store.steps()] == [(7, 100.0), (7, 950.0)]


def test_console_and_jsonl_records_of_one_step_at_one_time_are_two_rows(store: RunStore) -> None:
    store.add_steps([StepRecord(step=3, end_time=50.0, total=2.0, source="console"),
                     StepRecord(step=3, end_time=50.0, total=2.0, source="jsonl")])
    assert sorted(s.source for s in store.steps()) == ["console", "jsonl"]


def test_a_version_1_store_is_upgraded_keeping_its_steps(tmp_path: Path) -> None:
    from monitor.store import schema

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(schema._SCHEMA_V1 + "PRAGMA user_version = 1;")
    conn.execute("INSERT INTO steps (step, end_key, end_time, phases, metrics, source) "
                 "VALUES (1, 10.0, 10.0, '{}', '{}', NULL)")
    conn.commit()
    conn.close()
    with RunStore(path) as upgraded:
        assert [(s.step, s.end_time) for s in upgraded.steps()] == [(1, 10.0)]
        upgraded.add_batch(steps=[StepRecord(step=1, end_time=10.0, source="jsonl")],
                           positions=[_position(5)])
        assert len(upgraded.steps()) == 2 and upgraded.log_positions()


def test_rollout_samples_round_trip_and_an_older_store_reads_none(tmp_path: Path) -> None:
    from monitor.frames import ROLLOUT_COLUMNS

    path = tmp_path / "r.db"
    with RunStore(path) as st:
        assert list(st.rollout_frame().columns) == list(ROLLOUT_COLUMNS)  # no table yet
        assert len(st.rollout_frame()) == 0
        st.add_rollout_samples([
            {"ts": 100.0 + i, "node": "n0", "server": "10.0.0.1:8000", "engine": "vllm",
             "model": "7", "kv_cache_usage": 0.5 + i / 10, "running": 3, "waiting": 0,
             "paused": None, "preemptions_total": i, "sleeping": float("nan")}
            for i in range(4)])
    with RunStore(path) as st:  # another process opening the file later
        df = st.rollout_frame(start=101.0, end=102.0)
        assert df["ts"].tolist() == [101.0, 102.0]
        assert df["model"].tolist() == ["7", "7"]  # text, even when it looks like a number
        assert df["kv_cache_usage"].tolist() == [0.6, 0.7]
        assert df["paused"].isna().all() and df["sleeping"].isna().all()


def test_the_ledger_rows_round_trip_and_a_recount_replaces_the_first(store: RunStore) -> None:
    from monitor.analysis.goodput import CAUSES, LEDGER_COLUMNS

    def row(step: int, gpu: int, productive: float) -> dict:
        return {"step": step, "node": "n0", "gpu": gpu, "start": 10.0 * step - 10,
                "end": 10.0 * step, "tail": False, "wall": 10.0, "productive": productive,
                "weight_sync": 10.0 - productive}

    assert store.ledger().empty and list(store.ledger().columns) == LEDGER_COLUMNS
    store.add_batch(ledger=[row(1, 0, 6.0), row(1, 1, 7.0), row(2, 0, 9.0)])
    store.add_batch(ledger=[row(2, 0, 8.0)])  # counted again: the newer row stands
    led = store.ledger()
    assert len(led) == 3 and set(CAUSES) <= set(led.columns)
    assert led.loc[(led["step"] == 2), "productive"].tolist() == [8.0]
    assert led["weight_sync"].sum() == pytest.approx(4.0 + 3.0 + 2.0)
    assert (led[list(CAUSES)].sum(axis=1) == led["wall"]).all()
    assert store.ledger(start=15.0)["step"].tolist() == [2]
