"""One config path for the job's printed config (issues 27/28): verl 0.9's V1 separate-async
trainer prints the sync trainer's step keys, and only the config it prints at the start
(``trainer.use_v1: True``, ``trainer.v1.trainer_mode: separate_async``) says that its ``gen``
is the trainer waiting for samples. ``analyze``, ``/metrics`` of a real exporter process
(``verlmon_gpu_seconds_total``), the dashboard on the exporter's store and wandb must all read
that config and book the run alike: the same mode, the same productive share.

One real ``verl-monitor exporter`` follows a made-up log (the printed config, then step lines
dated as they are written, generation 45% of each step) with simulated GPUs, a store and an
offline wandb run. Each surface is compared with the ledger of the same data told the printed
config, which must differ clearly from the ledger that reads the keys alone.
"""

from __future__ import annotations

import json
import pprint
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from test_run_analysis_config_path import _share, dashboard_goodput, follow

from monitor.analysis.run_analysis import RunAnalysis
from monitor.config import load_config
from monitor.logs.job_config import read_job_config_file
from monitor.store.runstore import RunStore

pytestmark = pytest.mark.slow  # starts an exporter, Streamlit's AppTest, wandb's service

STEPS = 8  # steps the exporter must have counted before it is stopped
EVERY = 2.0  # seconds between step lines
PREFIX = "(TaskRunnerV1 pid=7) "
#: Any SM activity is full work: the live counter's own activity reference (``reference_sm: 0``)
#: grows with the steps it has seen, analyze's is the whole run's; the trainer mode is compared.
GOODPUT = "goodput:\n  reference_sm: {gen: 5, update_actor: 5}\n"
JOB_CONFIG = {"data": {"train_batch_size": 16},
              "trainer": {"use_v1": True, "n_gpus_per_node": 2,
                          "v1": {"trainer_mode": "separate_async"}}}


def _write_steps(path: Path, n: int, stop: threading.Event) -> None:
    """Step lines as verl 0.9's V1 trainer prints them in every mode (no switch_* timer),
    each dated when it is written: gen 45% of the step, the update 35%, the weight sync 20%."""
    for step in range(1, n + 1):
        if stop.wait(EVERY):
            return
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"{stamp.replace('+00:00', 'Z')} {PREFIX}step:{step} - "
                     f"timing_s/gen:{0.45 * EVERY:.3f} - "
                     f"timing_s/update_actor:{0.35 * EVERY:.3f} - "
                     f"timing_s/update_weights:{0.2 * EVERY:.3f} - timing_s/step:{EVERY} - "
                     "perf/throughput:1000.0 - response_length/max:96.0 - "
                     "response_length/mean:70.0\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The exporter's run: its log, /metrics at the end, and its store's frames and meta."""
    tmp = tmp_path_factory.mktemp("printedcfg")
    head = "".join(f"{PREFIX}{line}\n"
                   for line in pprint.pformat(JOB_CONFIG, width=60).split("\n"))
    secs = follow(tmp, GOODPUT, head, "printedcfg01",
                  lambda log, stop: _write_steps(log, STEPS + 6, stop))
    cfg, log = tmp / "config.yaml", tmp / "train.log"
    with RunStore(tmp / "run.db", create=False) as rs:
        steps, gpu, meta = rs.steps(), rs.gpu_frame(), rs.meta()
    return {"tmp": tmp, "log": log, "metrics": secs, "steps": steps, "gpu": gpu, "meta": meta,
            "config": load_config(str(cfg))}


def _analysis(run, told: bool, steps=None) -> RunAnalysis:
    return RunAnalysis(steps or run["steps"], run["gpu"], flags=[], config=run["config"],
                       job_config=read_job_config_file(run["log"]) if told else None)


def _expected(run, told: bool, steps=None) -> float:
    """The productive share of the ledger of the exporter's data, told the printed config
    or not."""
    led = _analysis(run, told, steps).ledger()
    return float(led["productive"].sum() / led["wall"].sum())


def test_the_printed_config_decides_the_mode_and_moves_metrics(run):
    assert _analysis(run, False).mode.mode == "sync"  # the keys alone read sync
    assert _analysis(run, True).mode.mode == "separate_async"
    told, keys = _expected(run, True), _expected(run, False)
    assert keys - told > 0.2, (keys, told)  # gen waits for samples: not productive
    assert run["metrics"].get("waiting_for_samples", 0.0) > 0.3 * sum(run["metrics"].values())
    got = _share(run["metrics"])
    assert abs(got - told) < 0.04, (got, told, keys)


def test_the_exporter_saved_the_printed_config_in_its_store(run):
    saved = run["meta"]["job_config"]
    assert saved["trainer"]["v1"]["trainer_mode"] == "separate_async"
    assert RunAnalysis(run["steps"], run["gpu"], job_config=saved).mode.mode == "separate_async"
    assert saved == JOB_CONFIG


def test_analyze_reads_the_same_printed_config(run, tmp_path, capsys, monkeypatch):
    """``analyze`` of the log (with the exporter's GPU samples): the printed config's mode,
    the same share as /metrics, and ``--wandb`` logs the steps under that config too."""
    from test_integrations_wandb_sink import _read_run

    from cli.main import main

    out = tmp_path / "export"
    assert main(["export", str(run["tmp"] / "run.db"), "--out", str(out)]) == 0
    capsys.readouterr()
    for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                        ("WANDB_DIR", str(tmp_path))):
        monkeypatch.setenv(name, value)
    assert main(["analyze", str(run["log"]), "--gpu", str(out / "gpu.csv"), "--json",
                 "--config", str(run["tmp"] / "config.yaml"),
                 "--wandb", "verlmon-test/printedcfg02"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trainer_mode"] == "separate_async"
    share = doc["goodput"]["goodput_share"]
    assert abs(share - _expected(run, True)) < 0.02
    assert abs(_share(run["metrics"]) - share) < 0.04  # /metrics and analyze agree
    rows = [h for h in _read_run(tmp_path, "printedcfg02")["history"]
            if "verlmon/goodput/productive" in h]
    assert len(rows) >= STEPS
    assert all(r["verlmon/goodput/waiting_for_samples"] > 0.3 for r in rows[1:])


def test_the_dashboard_reads_the_printed_config_from_the_store(run, monkeypatch):
    import shutil

    recent = run["steps"][-21:]  # the Overview's last 20 steps and the one before them
    told, keys = _expected(run, True, recent), _expected(run, False, recent)
    shown = dashboard_goodput(monkeypatch, VERLMON_STORE=run["tmp"] / "run.db")
    assert abs(shown - 100 * told) <= 3, (shown, told, keys)
    # a store without the printed config and without the ledger the exporter counted with it
    # (an older exporter's): the dashboard counts it itself, and the keys decide the mode
    from test_run_analysis_config_path import _without_ledger

    bare = run["tmp"] / "bare.db"
    shutil.copy(run["tmp"] / "run.db", bare)
    with RunStore(bare) as rs:
        rs.set_meta("job_config", None)
    assert abs(dashboard_goodput(monkeypatch, VERLMON_STORE=bare) - shown) <= 1  # its ledger
    _without_ledger(bare)
    assert abs(dashboard_goodput(monkeypatch, VERLMON_STORE=bare) - 100 * keys) <= 3, (told, keys)


def test_wandb_logs_the_goodput_of_the_printed_config(run):
    from test_integrations_wandb_sink import _read_run

    logged = _read_run(run["tmp"], "printedcfg01")
    rows = {int(h["verlmon/step"]): h for h in logged["history"]
            if "verlmon/goodput/productive" in h}
    assert len(rows) >= STEPS
    assert all(r["verlmon/goodput/waiting_for_samples"] > 0.3 for r in list(rows.values())[1:])
    mean = sum(r["verlmon/goodput/productive"] for r in rows.values()) / len(rows)
    assert abs(mean - _share(run["metrics"])) < 0.06
    assert abs(mean - _expected(run, True)) < 0.06
