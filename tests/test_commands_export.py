"""``verl-monitor export``: store -> files, and ``analyze`` on those files reproduces the run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cli.main import main
from monitor.frames import read_gpu_frame, read_host_frame
from monitor.logs.canonical_records import parse_file
from monitor.records import Event, Flag
from monitor.store import RunStore, StoreWriter

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def make_store(tmp_path: Path, log: Path) -> tuple[Path, list]:
    """Fill a store the way the exporter does: parsed steps, events, GPU/host samples, a flag."""
    parsed = parse_file(log)
    path = tmp_path / "run.db"
    writer = StoreWriter(RunStore(path))
    writer.put_steps(parsed.steps)
    writer.put_events(parsed.events)
    start = parsed.steps[0].end_time - (parsed.steps[0].total or 0.0)
    end = parsed.steps[-1].end_time
    gpu, host, t = [], [], start
    while t <= end:
        for g in range(2):
            gpu.append({"ts": t, "node": "n0", "gpu": g, "util": 90.0 - 50 * g,
                        "sm_active": None if g else 70.0, "mem_used_bytes": 5e9,
                        "mem_total_bytes": 8e10, "power_w": 400.0})
        host.append({"ts": t, "node": "n0", "cpu_max_core_pct": 99.0, "cpu_avg_pct": 20.0})
        t += 5.0
    writer.put_gpu(gpu)
    writer.put_host(host)
    writer.put_flags([Flag(kind="gpu_imbalance", severity="warning", start=start, end=None,
                           scope={"node": "n0", "gpus": [1]}, evidence="GPU 1 at 40%",
                           advice=["Set trainer.balance_batch=True."])])
    writer.set_meta("run_name", "fixture")
    assert writer.flush()
    writer.store.close()
    return path, parsed.steps


def analyze_json(capsys, *argv: str) -> dict:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def key(steps: list[dict]) -> list[tuple]:
    return [(s["step"], s["end_time"], s["total"],
             {k: round(v, 9) for k, v in s["phases"].items()}) for s in steps]


def test_export_then_analyze_reproduces_the_steps(tmp_path: Path, capsys) -> None:
    log = FIXTURES / "verl_0.9_fully_async.log"  # reshard comes from log lines, not keys
    store, _ = make_store(tmp_path, log)
    out = tmp_path / "out"
    assert main(["export", str(store), "--out", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} >= {
        "gpu.csv", "host.csv", "train.jsonl", "events.json", "flags.json"}
    original = analyze_json(capsys, str(log))
    again = analyze_json(capsys, str(out / "train.jsonl"), "--gpu", str(out / "gpu.csv"),
                         "--host", str(out / "host.csv"))
    assert again["format"] == "jsonl"
    assert key(again["steps"]) == key(original["steps"])
    assert [s["metrics"].get("timing_s/gen") for s in again["steps"]] == [
        s["metrics"].get("timing_s/gen") for s in original["steps"]]
    assert again["summary"]["phases"] == original["summary"]["phases"]
    assert again["attribution"]  # the exported GPU samples line up with the steps


def test_exported_files_hold_what_the_store_holds(tmp_path: Path, capsys) -> None:
    store, steps = make_store(tmp_path, FIXTURES / "verl_0.7.1_update_weights_oom.log")
    out = tmp_path / "out"
    assert main(["export", str(store), "--out", str(out)]) == 0
    gpu = read_gpu_frame(out / "gpu.csv")
    with RunStore(store, create=False) as s:
        assert len(gpu) == len(s.gpu_frame())
        assert gpu["sm_active"].isna().sum() == s.gpu_frame()["sm_active"].isna().sum() > 0
    assert len(read_host_frame(out / "host.csv")) > 0
    lines = (out / "train.jsonl").read_text().splitlines()
    assert len(lines) == len(steps)
    first = json.loads(lines[0])
    assert set(first) == {"step", "ts", "data"} and first["ts"] == steps[0].end_time
    events = json.loads((out / "events.json").read_text())
    assert {"oom", "traceback"} <= {e["kind"] for e in events}
    flags = json.loads((out / "flags.json").read_text())
    assert flags[0]["scope"] == {"node": "n0", "gpus": [1]}
    assert flags[0]["advice"] == ["Set trainer.balance_batch=True."]
    assert json.loads((out / "meta.json").read_text()) == {"run_name": "fixture"}


def test_nan_metrics_become_null(tmp_path: Path, capsys) -> None:
    from monitor.records import StepRecord

    path = tmp_path / "run.db"
    with RunStore(path) as s:
        s.add_steps([StepRecord(step=1, end_time=100.0, total=5.0, phases={"gen": 5.0},
                                metrics={"timing_s/gen": 5.0, "timing_s/step": 5.0,
                                         "actor/lr": float("nan"), "x": float("inf")})])
        s.add_events([Event(kind="resume", time=float("nan"), step=1)])
    assert main(["export", str(path), "--out", str(tmp_path / "o")]) == 0
    line = (tmp_path / "o" / "train.jsonl").read_text()
    assert json.loads(line)["data"]["actor/lr"] is None and "NaN" not in line
    assert "Infinity" not in line


def test_missing_store_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    code = main(["export", str(tmp_path / "none.db"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"verl-monitor export: {tmp_path / 'none.db'}: no such file\n"
    assert not (tmp_path / "none.db").exists()


def test_not_a_store_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("hello")
    assert main(["export", str(junk), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "not a verl-monitor run store" in err and err.count("\n") == 1
    other = tmp_path / "other.db"  # some other program's SQLite file: refused, left untouched
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    assert main(["export", str(other), "--out", str(tmp_path / "o2")]) == 2
    assert "not a verl-monitor run store" in capsys.readouterr().err
    conn = sqlite3.connect(other)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    conn.close()
    assert tables == ["t"]


@pytest.mark.slow  # a second or more of CPU by design (a whole run analysed)
def test_a_store_damaged_part_way_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    """The export streams: damage met after the first chunks is said in one line too."""
    import os

    path = tmp_path / "run.db"
    with RunStore(path) as store:
        store.add_gpu_samples([{"ts": float(i), "node": "n0", "gpu": i % 8, "util": 50.0}
                               for i in range(60_000)])
        store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size
    with path.open("r+b") as fh:  # scribble over pages in the middle of the samples
        fh.seek(size // 2 - (size // 2) % 4096)
        fh.write(os.urandom(8 * 4096))
    code = main(["export", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("verl-monitor export: ")
    assert "Traceback" not in err


def test_events_file_brings_back_ooms_and_their_flag(tmp_path: Path, capsys) -> None:
    log = FIXTURES / "verl_0.7.1_update_weights_oom.log"
    store, _ = make_store(tmp_path, log)
    out = tmp_path / "out"
    assert main(["export", str(store), "--out", str(out)]) == 0
    capsys.readouterr()
    original = analyze_json(capsys, str(log))
    again = analyze_json(capsys, str(out / "train.jsonl"), "--events", str(out / "events.json"))
    assert again["summary"]["events"]["counts"] == original["summary"]["events"]["counts"]
    assert "oom" in {f["kind"] for f in again["flags"]}
    (tmp_path / "bad.json").write_text('{"kind": "oom"}')
    assert main(["analyze", str(out / "train.jsonl"), "--events", str(tmp_path / "bad.json")]) == 2
    assert "expected a JSON list of events" in capsys.readouterr().err
