"""One config path (issue 27): a ``goodput:`` override in ``--config`` changes ``analyze``,
``/metrics`` of a real exporter process, the dashboard and wandb alike.

One real ``verl-monitor exporter`` process follows a simulated run with ``--config`` (every
compute phase's reference SM activity set to 100%), a store and an offline wandb run. Each
surface's goodput is then compared with the ledger of the same data under the override and
under the packaged defaults: it must match the first and differ clearly from the second.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from monitor.analysis.run_analysis import RunAnalysis
from monitor.config import load_config
from monitor.store.runstore import RunStore

pytestmark = pytest.mark.slow  # starts an exporter, Streamlit's AppTest, wandb's service

OVERRIDE = "goodput:\n  reference_sm: {gen: 100, old_log_prob: 100, ref: 100, values: 100,\n" \
           "                 update_actor: 100, update_critic: 100}\n"
STEPS = 8  # steps the exporter must have counted before it is stopped


def _cli() -> str:
    return shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"


def _gpu_seconds(text: str) -> dict[str, float]:
    """``verlmon_gpu_seconds_total`` summed over GPUs, by cause."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("verlmon_gpu_seconds_total{"):
            cause = re.search(r'cause="([^"]+)"', line).group(1)
            out[cause] = out.get(cause, 0.0) + float(line.split()[-1])
    return out


def _share(secs: dict[str, float]) -> float:
    return secs.get("productive", 0.0) / sum(secs.values())


def _write_steps(path: Path, n: int, every: float, stop) -> None:
    """A verl console log written as a job would: one step line every ``every`` seconds
    (generation 60% of the step, the update 40%), timed by arrival."""
    for step in range(1, n + 1):
        if stop.wait(every):
            return
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"step:{step} - timing_s/step:{every} - timing_s/gen:{0.6 * every:.3f} - "
                     f"timing_s/update_actor:{0.4 * every:.3f} - perf/throughput:1000.0 - "
                     "response_length/max:96.0 - response_length/mean:70.0\n")


def follow(tmp: Path, config: str, head: str, wandb_run: str,
           write: Callable[[Path, threading.Event], None],
           steps: int = STEPS + 2) -> dict[str, float]:
    """Run a real exporter (simulated GPUs, ``--config tmp/config.yaml`` holding ``config``,
    its store ``tmp/run.db``, wandb run ``wandb_run`` offline under ``tmp``) following
    ``tmp/train.log`` (``head``, then what ``write(log, stop)`` writes on a thread) until
    ``/metrics`` has counted ``steps`` steps; then stop both. Returns
    ``verlmon_gpu_seconds_total`` by cause as it stood then."""
    import os

    (tmp / "config.yaml").write_text(config)
    log = tmp / "train.log"
    log.write_text(head)
    stop = threading.Event()
    writer = threading.Thread(target=write, args=(log, stop), daemon=True)
    args = ["--config", str(tmp / "config.yaml"), "--log", str(log),
            "--wandb", f"verlmon-test/{wandb_run}"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp)}
    proc = subprocess.Popen(
        [_cli(), "exporter", "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim",
         "--scenario", "healthy", "--sim-gpus", "2", "--interval", "0.25",
         "--store", str(tmp / "run.db"), "--no-collector.host", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/metrics", line)
        assert url, (line, proc.stderr.read() if proc.poll() is not None else "")
        writer.start()
        deadline = time.monotonic() + 240
        while True:  # the counter holds whole steps: wait for enough of them
            text = httpx.get(url.group(0), timeout=10).text
            secs = _gpu_seconds(text)
            counted = re.search(r"^verlmon_training_step (\S+)", text, re.M)
            if secs and counted and float(counted.group(1)) >= steps:
                return secs
            assert time.monotonic() < deadline, "the exporter counted too few steps"
            time.sleep(0.5)
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, proc.stderr.read()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The exporter's run: its config, /metrics at the end, its store and its wandb folder."""
    tmp = tmp_path_factory.mktemp("cfgpath")
    secs = follow(tmp, OVERRIDE, "", "cfgpath01",
                  lambda log, stop: _write_steps(log, STEPS + 6, 2.0, stop))
    cfg = tmp / "config.yaml"
    with RunStore(tmp / "run.db", create=False) as rs:
        steps, gpu = rs.steps(), rs.gpu_frame()
    return {"tmp": tmp, "config": cfg, "metrics": secs, "steps": steps, "gpu": gpu}


def dashboard_goodput(monkeypatch, **env) -> int:
    """The Overview's "Goodput (last steps)" (%) of the dashboard app run with ``env`` (its
    ``VERLMON_*`` variables), over the whole run."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboards.html_blocks import stat_values

    app = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")
    for name in ("VERLMON_STORE", "VERLMON_PROMETHEUS", "VERLMON_JOB", "VERLMON_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    st.cache_data.clear()
    st.cache_resource.clear()
    at = AppTest.from_file(app, default_timeout=60)
    at.query_params["window"] = "all"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    values: dict = {}
    for block in at.html:
        values.update(stat_values(block.value))
    return int(values["Goodput (last steps)"].rstrip("%"))


def _expected(run, config, steps=None) -> float:
    """The productive share of the ledger of the exporter's data under ``config``."""
    ra = RunAnalysis(steps or run["steps"], run["gpu"], config=config, flags=[])
    led = ra.ledger()
    return float(led["productive"].sum() / led["wall"].sum())


def test_metrics_follow_the_exporters_config(run):
    strict = _expected(run, load_config(str(run["config"])))
    default = _expected(run, load_config())
    assert default - strict > 0.1, (default, strict)  # the override matters on this run
    got = _share(run["metrics"])
    assert abs(got - strict) < 0.04, (got, strict, default)


def test_analyze_follows_its_config(run, tmp_path, capsys):
    from cli.main import main

    out = tmp_path / "export"
    assert main(["export", str(run["tmp"] / "run.db"), "--out", str(out)]) == 0
    capsys.readouterr()
    args = ["analyze", str(out / "train.jsonl"), "--gpu", str(out / "gpu.csv"), "--json"]
    assert main([*args, "--config", str(run["config"])]) == 0
    strict = json.loads(capsys.readouterr().out)["goodput"]["goodput_share"]
    assert main(args) == 0
    default = json.loads(capsys.readouterr().out)["goodput"]["goodput_share"]
    assert abs(strict - _expected(run, load_config(str(run["config"])))) < 0.02
    assert default - strict > 0.1
    assert abs(_share(run["metrics"]) - strict) < 0.04  # /metrics and analyze agree


def test_the_dashboard_reads_the_config_the_exporter_saved_in_its_store(run, monkeypatch):
    def goodput(**env) -> int:
        return dashboard_goodput(monkeypatch, **env)

    recent = run["steps"][-21:]  # the Overview's last 20 steps and the one before them
    strict = _expected(run, load_config(str(run["config"])), recent)
    default = _expected(run, load_config(), recent)
    shown = goodput(VERLMON_STORE=run["tmp"] / "run.db")
    assert abs(shown - 100 * strict) <= 3, (shown, strict, default)
    # the store holds the ledger the exporter counted with its config: without the config in
    # its meta it shows the same numbers (one ledger on every surface)
    kept = run["tmp"] / "kept.db"
    shutil.copy(run["tmp"] / "run.db", kept)
    with RunStore(kept) as rs:
        rs.set_meta("config", None)
    assert abs(goodput(VERLMON_STORE=kept) - shown) <= 1
    # a store without the exporter's config nor its ledger (an older exporter's): the
    # dashboard counts the ledger itself, and `dashboard --config FILE` gives it the config
    bare = run["tmp"] / "bare.db"
    shutil.copy(kept, bare)
    _without_ledger(bare)
    assert abs(goodput(VERLMON_STORE=bare) - 100 * default) <= 3
    assert abs(goodput(VERLMON_STORE=bare, VERLMON_CONFIG=run["config"]) - 100 * strict) <= 3


def _without_ledger(path: Path) -> None:
    """The store as an exporter that kept no ledger rows left it."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM ledger")


def test_wandb_logs_the_goodput_of_the_exporters_config(run):
    from test_integrations_wandb_sink import _read_run

    logged = _read_run(run["tmp"], "cfgpath01")
    rows = {int(h["verlmon/step"]): h for h in logged["history"]
            if "verlmon/goodput/productive" in h}
    assert len(rows) >= STEPS
    steps = [s for s in run["steps"] if int(s.step) in rows]
    ra = RunAnalysis(run["steps"], run["gpu"], config=load_config(str(run["config"])), flags=[])
    led = ra.ledger()
    per = led.groupby("step")[["productive", "wall"]].sum()
    close = [abs(rows[int(s.step)]["verlmon/goodput/productive"]
                 - per.loc[int(s.step), "productive"] / per.loc[int(s.step), "wall"]) < 0.05
             for s in steps[1:] if int(s.step) in per.index]
    assert sum(close) >= 0.8 * len(close), close
    mean = sum(r["verlmon/goodput/productive"] for r in rows.values()) / len(rows)
    assert abs(mean - _share(run["metrics"])) < 0.06
