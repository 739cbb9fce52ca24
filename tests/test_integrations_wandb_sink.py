"""monitor.integrations.wandb_sink: real offline wandb runs read back from their files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from monitor.analysis.attribution import attribute, phase_summary
from monitor.integrations.wandb_sink import (
    WandbSink,
    parse_wandb_target,
    step_payload,
)
from monitor.records import Flag, StepRecord

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

T0 = 1_790_000_000.0


# ------------------------------------------------------------------ reading a run back


def _records(path: Path):
    """Protobuf records of a ``run-<id>.wandb`` file (LevelDB log framing, 32 KiB blocks)."""
    block, header = 32768, 7
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:header])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    pos, pending = header, b""
    while True:
        if block - pos % block < header:
            pos += block - pos % block
        if pos + header > len(data):
            return
        _crc, size, kind = struct.unpack("<IHB", data[pos:pos + header])
        chunk = data[pos + header:pos + header + size]
        pos += header + size
        if kind == 1:
            yield wandb_pb.Record.FromString(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield wandb_pb.Record.FromString(pending + chunk)
            pending = b""


def _read_run(wandb_dir: Path, run_id: str, timeout: float = 30) -> dict:
    """The run's history, alerts and flag tables, once wandb has written its exit record."""
    (path,) = wandb_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    deadline = time.monotonic() + timeout
    while True:  # wandb's service finishes writing the file shortly after run.finish()
        records = list(_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.2)
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            history.append({("/".join(i.nested_key) if i.nested_key else i.key):
                            json.loads(i.value_json) for i in r.history.item})
    summary: dict = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                key = "/".join(item.nested_key) if item.nested_key else item.key
                summary[key] = json.loads(item.value_json)
    alerts = [r.alert for r in records if r.WhichOneof("record_type") == "alert"]
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    tables = sorted(path.parent.glob("files/media/table/verlmon/flags_*.table.json"),
                    key=lambda p: int(p.name.split("_")[1]))
    return {"history": history, "alerts": alerts, "run": runs[0], "tables": tables,
            "summary": summary, "dir": path.parent}


# ------------------------------------------------------------------ a small simulated job


def _steps() -> list[StepRecord]:
    """Three 10 s steps: gen 6 s, update_actor 2 s, comm 1 s, the rest unexplained."""
    return [StepRecord(step=s, end_time=T0 + 10 * s, total=10.0, throughput=1200.0 + s,
                       phases={"gen": 6.0, "update_actor": 2.0, "comm": 1.0})
            for s in (1, 2, 3)]


def _gpu_frame() -> pd.DataFrame:
    """Two GPUs sampled every 0.5 s; GPU 1 is a straggler (SM activity 20 vs 80)."""
    ts = np.arange(T0 + 0.25, T0 + 30, 0.5)
    rows = []
    for t in ts:
        rows.append({"ts": t, "node": "n0", "gpu": 0, "util": 95.0, "sm_active": 80.0})
        rows.append({"ts": t, "node": "n0", "gpu": 1, "util": 90.0, "sm_active": 20.0})
    return pd.DataFrame(rows)


def _flag(kind: str, severity: str, start: float, end: float | None = None,
          gpus: list[int] | None = None) -> Flag:
    return Flag(kind=kind, severity=severity, start=start, end=end,
                scope={"node": "n0", "gpus": gpus or [1]},
                evidence=f"{kind}: GPU 1 at 25% of its peers' SM activity",
                advice=["Check actor_rollout_ref.rollout.tensor_model_parallel_size."])


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


# ------------------------------------------------------------------ pure parts


def test_parse_wandb_target_forms_and_errors():
    assert parse_wandb_target("rl") == (None, "rl", None)
    assert parse_wandb_target("rl/abc123") == (None, "rl", "abc123")
    assert parse_wandb_target("team/rl/abc123") == ("team", "rl", "abc123")
    assert parse_wandb_target("https://wandb.ai/team/rl/runs/abc123?nw=x") == (
        "team", "rl", "abc123")
    for bad in ("", "a/b/c/d", "rl/", "has space/x"):
        with pytest.raises(ValueError, match="--wandb"):
            parse_wandb_target(bad)


def test_step_payload_shares_and_per_phase_activity():
    steps = _steps()
    attrib = attribute(steps, _gpu_frame())
    payload = step_payload(steps[1], attrib, extra={"nccl_comm_share": 0.12})
    assert payload["verlmon/step"] == 2
    assert payload["verlmon/step_time_s"] == 10.0
    assert payload["verlmon/phase_share/gen"] == pytest.approx(0.6)
    assert payload["verlmon/comm_share"] == pytest.approx(0.1)
    assert payload["verlmon/nccl_comm_share"] == 0.12
    # both GPUs equally sampled: mean of 80 and 20; the least busy GPU is the straggler
    assert payload["verlmon/sm_active_pct/gen"] == pytest.approx(50.0)
    assert payload["verlmon/sm_active_min_gpu_pct/gen"] == pytest.approx(20.0)
    assert payload["verlmon/gpu_util_pct/step"] == pytest.approx(92.5)
    # rows of other steps are ignored; no attribution gives no activity keys
    bare = step_payload(StepRecord(step=9, total=None, phases={"gen": float("nan")}), attrib)
    assert bare == {"verlmon/step": 9.0}


# ------------------------------------------------------------------ real offline runs


@pytest.mark.slow
def test_live_logging_read_back_from_the_offline_run(offline):
    steps = _steps()
    sink = WandbSink("verlmon-test", "live01", init_timeout=30, wandb_dir=offline)
    assert sink.enabled and sink.mode == "offline" and sink.errors == 0
    gpu = _gpu_frame()
    imbalance = _flag("gpu_imbalance", "warning", T0 + 12)
    info = _flag("util_overstates_sm", "info", T0 + 13)
    # the exporter's detector runs: overlapping windows, each step logged once
    assert sink.log_window(steps[:2], gpu, [imbalance, info], []) == 2
    assert sink.log_window(steps, gpu, [], [_flag("gpu_imbalance", "warning", T0 + 12,
                                                   end=T0 + 28)]) == 1
    assert sink.log_window(steps, gpu) == 0
    sink.log_flags([_flag("gpu_imbalance", "critical", T0 + 29)], [])
    sink.close()
    assert not sink.enabled

    run = _read_run(offline, "live01")
    assert run["run"].run_id == "live01" and run["run"].project == "verlmon-test"
    step_rows = [h for h in run["history"] if "verlmon/step_time_s" in h]
    assert [h["verlmon/step"] for h in step_rows] == [1, 2, 3]
    assert all(h["verlmon/sm_active_min_gpu_pct/gen"] == pytest.approx(20.0)
               for h in step_rows)
    flag_rows = [h for h in run["history"] if "verlmon/flags_open/warning" in h]
    assert [(h["verlmon/flags_open/warning"], h["verlmon/flags_open/critical"])
            for h in flag_rows] == [(1, 0), (0, 0), (0, 1)]
    # one alert per warning/critical flag; the info flag raises none
    assert [(a.level, a.title.split(":")[1].split()[0]) for a in run["alerts"]] == [
        ("WARN", "gpu_imbalance"), ("ERROR", "gpu_imbalance")]
    assert "25% of its peers" in run["alerts"][0].text
    assert "tensor_model_parallel_size" in run["alerts"][0].text
    last = json.loads(run["tables"][-1].read_text())
    assert last["columns"][:3] == ["kind", "severity", "scope"]
    states = [(row[0], row[1], row[5]) for row in last["data"]]
    assert states == [("gpu_imbalance", "warning", "closed"),
                      ("util_overstates_sm", "info", "open"),
                      ("gpu_imbalance", "critical", "open")]


@pytest.mark.slow
def test_log_analysis_logs_every_step_and_alerts_once_per_flag(offline):
    steps = _steps()
    flags = [_flag("gpu_imbalance", "warning", T0 + 5, end=T0 + 15),
             _flag("gpu_imbalance", "warning", T0 + 20, end=T0 + 30),
             _flag("oom", "critical", T0 + 29, gpus=[0]),
             _flag("low_utilization", "info", T0 + 1)]
    with WandbSink.from_target("verlmon-test/ana01", wandb_dir=offline) as sink:
        sink.log_analysis(steps, flags, attribute(steps, _gpu_frame()))
        sink.log_flags([flags[2]], [])  # the same flag again: no second alert
    run = _read_run(offline, "ana01")
    assert len([h for h in run["history"] if "verlmon/step_time_s" in h]) == 3
    assert Counter(a.level for a in run["alerts"]) == {"WARN": 2, "ERROR": 1}
    table = json.loads(run["tables"][0].read_text())
    assert sorted(row[0] for row in table["data"]) == [
        "gpu_imbalance", "gpu_imbalance", "low_utilization", "oom"]
    assert run["summary"]["verlmon/flags/warning"] == 2
    assert run["summary"]["verlmon/sm_active_min_gpu_pct/gen"] == pytest.approx(20.0)
    (phase_table,) = run["dir"].glob("files/media/table/verlmon/phase_activity_*.table.json")
    phases = {row[0] for row in json.loads(phase_table.read_text())["data"]}
    assert {"gen", "update_actor", "comm", "other"} <= phases


@pytest.mark.slow
def test_log_analysis_accepts_a_phase_summary(offline):
    steps = _steps()
    summary = phase_summary(attribute(steps, _gpu_frame()))
    with WandbSink("verlmon-test", "ana02", wandb_dir=offline) as sink:
        sink.log_analysis(steps, [], summary)
    run = _read_run(offline, "ana02")
    assert run["summary"]["verlmon/sm_active_pct/gen"] == pytest.approx(50.0)
    assert run["summary"]["verlmon/flags/critical"] == 0
    assert [h["verlmon/step"] for h in run["history"] if "verlmon/step_time_s" in h] == [1, 2, 3]


# ------------------------------------------------------------------ failure modes (subprocess)


SCRIPT = """
import json, logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(name)s| %(message)s", stream=sys.stderr)
from monitor.integrations.wandb_sink import WandbSink
from monitor.records import StepRecord
t0 = time.monotonic()
sink = WandbSink("verlmon-test", "{run_id}", mode="online", init_timeout=2)
payload = sink.log_step(StepRecord(step=1, total=10.0, phases={{"gen": 6.0}}))
enabled = sink.enabled
sink.close()
print(json.dumps({{"mode": sink.mode, "enabled": enabled, "errors": sink.errors,
                  "logged": payload, "seconds": time.monotonic() - t0}}))
"""


def _run_isolated(tmp_path: Path, run_id: str, env: dict[str, str], prelude: str = ""):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    clean.update({"HOME": str(tmp_path / "home"), "NETRC": str(tmp_path / "no-netrc"),
                  "WANDB_DIR": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path / "cfg"),
                  "WANDB_CACHE_DIR": str(tmp_path / "cache")}, **env)
    (tmp_path / "home").mkdir(exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", prelude + SCRIPT.format(run_id=run_id)],
                          capture_output=True, text=True, timeout=90, env=clean,
                          stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("verl_monitor.wandb|")]
    return json.loads(proc.stdout.strip().splitlines()[-1]), ours, elapsed


@pytest.mark.slow
def test_online_without_api_key_falls_back_to_offline_without_hanging(tmp_path):
    out, lines, elapsed = _run_isolated(tmp_path, "nokey01", {})
    assert out["enabled"] and out["mode"] == "offline"
    assert len(lines) == 1 and "no API key" in lines[0] and "wandb sync" in lines[0]
    assert elapsed < 90
    run = _read_run(tmp_path, "nokey01")  # nothing lost: the step is in the offline run
    assert [h["verlmon/step_time_s"] for h in run["history"]] == [10.0]


@pytest.mark.slow
def test_unreachable_server_falls_back_to_offline_within_the_init_timeout(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out, lines, _ = _run_isolated(tmp_path, "nonet01", {
        "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": f"http://127.0.0.1:{port}"})
    assert out["enabled"] and out["mode"] == "offline" and out["errors"] == 1
    assert len(lines) == 1 and "online start failed" in lines[0]
    assert _read_run(tmp_path, "nonet01")["history"][0]["verlmon/step"] == 1


@pytest.mark.slow
def test_without_the_wandb_package_it_disables_itself_in_one_line(tmp_path):
    out, lines, _ = _run_isolated(tmp_path, "nopkg01", {},
                                  prelude="import sys; sys.modules['wandb'] = None\n")
    assert not out["enabled"] and out["mode"] is None and out["errors"] == 1
    assert out["logged"]["verlmon/step_time_s"] == 10.0
    assert len(lines) == 1 and "not installed" in lines[0]


@pytest.mark.slow
def test_analyze_with_wandb_logs_the_run_it_analyzed(offline, monkeypatch, tmp_path, capsys):
    """``verl-monitor analyze --wandb PROJECT/RUN`` sends every parsed step and the flags of
    a simulated gpu_imbalance run to a real (offline) wandb run, and still prints its report."""
    from cli.main import main
    from monitor.sim.engine import SimRun

    monkeypatch.setenv("WANDB_DIR", str(offline))
    run_dir = tmp_path / "sim"
    SimRun("gpu_imbalance", steps=24, gpus_per_node=4, seed=2, step_seconds=20).write(run_dir)
    status = main(["analyze", str(run_dir / "train.log"), "--gpu", str(run_dir / "gpu.csv"),
                   "--host", str(run_dir / "host.csv"), "--wandb", "verlmon-test/cli01"])
    assert status == 0
    assert "gpu_imbalance" in capsys.readouterr().out
    run = _read_run(offline, "cli01")
    assert len([h for h in run["history"] if "verlmon/step_time_s" in h]) == 24
    assert any(a.title and "gpu_imbalance" in a.title for a in run["alerts"])


@pytest.mark.slow
def test_exporter_with_wandb_raises_an_alert_for_a_critical_flag(offline, monkeypatch):
    """``verl-monitor exporter --wandb PROJECT/RUN``: a flag the live detectors open reaches
    the wandb run as a run.alert, and stopping the exporter closes the run."""
    from cli.commands.exporter import parse_options
    from exporters.node_exporter import Exporter
    from monitor.records import Event

    monkeypatch.setenv("WANDB_DIR", str(offline))
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--detect-interval", "600", "--wandb", "verlmon-test/exp01"]))
    exporter.start()
    try:
        deadline = time.monotonic() + 60
        while exporter.monitor.wandb_sink is None:
            assert time.monotonic() < deadline, "wandb sink never became ready"
            time.sleep(0.1)
        exporter.monitor.window.add_events([Event("oom", time.time(), 3, "CUDA out of memory")])
        opened, _ = exporter.detect_once()
        assert "oom" in [f.kind for f in opened]
    finally:
        exporter.stop()
    run = _read_run(offline, "exp01")
    assert [a.level for a in run["alerts"]] == ["ERROR"]
    assert "oom" in run["alerts"][0].title


@pytest.mark.slow
def test_goodput_shares_per_step_from_a_real_run_reach_wandb(offline):
    """The real 2-H200 data stall: the stalled steps log a large goodput/data_loading share,
    each step's shares add up to 1, and a healthy step's data_loading share is near 0."""
    from monitor.frames import read_gpu_frame
    from monitor.logs.canonical_records import parse_file

    d = Path(__file__).parent / "fixtures" / "real_gpu" / "2gpu_data_stall"
    steps = parse_file(str(d / "train.jsonl")).steps
    gpu = read_gpu_frame(d / "gpu.csv")
    with WandbSink.from_target("verlmon-test/gp01", wandb_dir=offline) as sink:
        sink.log_analysis(steps, [], attribute(steps, gpu), gpu)
    run = _read_run(offline, "gp01")
    rows = {int(h["verlmon/step"]): h for h in run["history"] if "verlmon/step" in h}
    assert set(rows) >= {3, 4, 5, 6, 7}
    for step in (4, 5, 6, 7):
        assert rows[step]["verlmon/goodput/data_loading"] > 0.3
    assert rows[3]["verlmon/goodput/data_loading"] < 0.05
    total = sum(v for k, v in rows[5].items() if k.startswith("verlmon/goodput/"))
    assert total == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
def test_the_run_summary_names_the_flag_that_costs_the_most_gpu_time(offline):
    """The real 2-H200 long tail: of its two flags, rollout_long_tail costs the most GPU
    time; the run summary names it, as analyze and the dashboard do."""
    from monitor.analysis.run_analysis import RunAnalysis
    from monitor.frames import read_gpu_frame
    from monitor.logs.canonical_records import parse_file

    d = Path(__file__).parent / "fixtures" / "real_gpu" / "2gpu_long_tail"
    parsed = parse_file(str(d / "train.jsonl"))
    gpu = read_gpu_frame(d / "gpu.csv")
    ra = RunAnalysis(parsed.steps, gpu, events=parsed.events)
    flags = ra.flags()
    assert {f.kind for f in flags} >= {"rollout_long_tail", "gpu_imbalance"}
    with WandbSink.from_target("verlmon-test/top01", wandb_dir=offline) as sink:
        sink.log_analysis(parsed.steps, flags, attribute(parsed.steps, gpu), gpu)
    summary = _read_run(offline, "top01")["summary"]
    assert summary["verlmon/top_problem"] == "rollout_long_tail"
    assert summary["verlmon/top_problem_gpu_seconds"] == pytest.approx(
        ra.top_problem()["gpu_seconds"], rel=1e-3)


@pytest.mark.slow
def test_the_run_summary_carries_the_headline_analyze_prints(offline, monkeypatch, capsys):
    """Issue 38 item 1: wandb's run summary has the headline of the report (state, words,
    goodput, top loss), the one computation the Overview and analyze use."""
    from cli.main import main

    monkeypatch.setenv("WANDB_DIR", str(offline))
    d = Path(__file__).parent / "fixtures" / "real_gpu" / "2gpu_long_tail"
    assert main(["analyze", str(d / "train.jsonl"), "--gpu", str(d / "gpu.csv"), "--json",
                 "--wandb", "verlmon-test/head01"]) == 0
    head = json.loads(capsys.readouterr().out)["headline"]
    summary = _read_run(offline, "head01")["summary"]
    assert summary["verlmon/headline"] == head["text"]
    assert summary["verlmon/state"] == head["state"]
    assert summary["verlmon/goodput"] == pytest.approx(head["goodput"], abs=1e-3)
    assert summary["verlmon/top_loss"] == head["top_loss"]
    assert summary["verlmon/top_loss_share"] == pytest.approx(head["top_loss_share"], abs=1e-3)


def test_the_ledger_across_attempts_reaches_the_offline_run(offline):
    from test_analysis_attempts import _job

    from monitor.analysis.attempts import job_ledger

    ledger = job_ledger(*_job())
    sink = WandbSink("verlmon-test", "jobs01", init_timeout=30, wandb_dir=offline)
    logged = sink.log_attempts(ledger)
    sink.close()
    run = _read_run(offline, "jobs01")
    assert logged["verlmon/job/ettr"] == ledger["ettr"] == round(141 / 395, 4)
    row = next(h for h in run["history"] if "verlmon/job/ettr" in h)
    assert row["verlmon/job/seconds/hang"] == 53.0 and row["verlmon/job/attempts"] == 3
    assert run["summary"]["verlmon/job/ettr"] == ledger["ettr"]
    (table,) = run["dir"].glob("files/media/table/verlmon/attempts_*.table.json")
    data = json.loads(table.read_text())
    assert [r[3] for r in data["data"]] == ["crash", "terminated", "finished"]
