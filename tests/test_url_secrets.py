"""Issue 30 row 4: a password in a URL option (``http://user:PASS@host``) is used for HTTP basic
authentication and never appears in /metrics labels, the log, the store, exports or messages.
Every option that takes a URL is tried against a real server on 127.0.0.1 that checks the
Authorization header: ``--rollout-server``, ``--phase-source``, ``dashboard --prometheus``."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporters.collectors.rollout_engine import RolloutEngineCollector
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext
from monitor.live.phase_timeline import PhaseSource, PhaseSourceError
from monitor.sim.engine_server import EngineState, exposition
from monitor.urls import UrlError, redact, split_url
from tests.http_peers import AuthServer, ListSink, driver_metrics
from tests.ports import free_port

USER, PASSWORD = "verl", "s3cr3t-P@ss:word"
#: the password as it is written inside a URL (percent-encoded ``@`` and ``:``)
QUOTED = "s3cr3t-P%40ss%3Aword"
SECRET_PIECES = ("s3cr3t", QUOTED, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())


def leaks(text: str) -> list[str]:
    return [p for p in SECRET_PIECES if p in text]


def with_secret(port: int, path: str = "") -> str:
    return f"http://{USER}:{QUOTED}@127.0.0.1:{port}{path}"


def basic() -> str:
    return "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def test_split_url_forms() -> None:
    s = split_url(with_secret(9048, "/metrics?x=1"))
    assert s.url == "http://127.0.0.1:9048/metrics?x=1" and s.display == s.url
    assert (s.username, s.password) == (USER, PASSWORD)
    assert s.auth_header() == {"Authorization": basic()}
    assert PASSWORD not in repr(s)
    bare = split_url(f"{USER}:{QUOTED}@10.0.0.5:8000")
    assert bare.url == "10.0.0.5:8000" and bare.password == PASSWORD
    assert split_url("http://h:1/").auth_header() == {} and split_url("h:1").url == "h:1"
    with pytest.raises(UrlError) as err:
        split_url(f"http://{USER}:{QUOTED}@host:notaport/", "--rollout-server")
    assert "--rollout-server" in str(err.value) and leaks(str(err.value)) == []
    assert redact(f"cannot reach {with_secret(1)}/x") == "cannot reach http://127.0.0.1:1/x"


@pytest.fixture
def engine():
    srv = AuthServer(lambda path: exposition("vllm", EngineState(running=3.0)), USER, PASSWORD)
    yield srv
    srv.close()


def test_rollout_server_credentials_authenticate_and_stay_secret(engine, caplog) -> None:
    """Before: the server label was ``verl:PASS@127.0.0.1:PORT`` (in /metrics, the log, the
    store and rollout.csv) and no Authorization header was sent."""
    sink = ListSink()
    down = free_port()  # nothing listens: the log line that says so names the server
    opts = ExporterOptions(rollout_server=(with_secret(engine.port), with_secret(down)),
                           rollout_timeout=2.0)
    col = RolloutEngineCollector(ExporterContext(node="n0", interval=1.0, sink=sink,
                                                 options=opts))
    with caplog.at_level(logging.INFO, logger="verl_monitor.exporter"):
        assert col.sample_once()
    assert engine.seen[0] == basic()
    assert [r["server"] for r in sink.rows] == [f"127.0.0.1:{engine.port}"]
    assert sink.rows[0]["running"] == 3.0
    reg = CollectorRegistry()
    reg.register(col)
    text = generate_latest(reg).decode()
    assert f'server="127.0.0.1:{engine.port}"' in text
    assert leaks(text) == [] and leaks(json.dumps(sink.rows)) == []
    assert f"127.0.0.1:{down}: down" in caplog.text and leaks(caplog.text) == []
    col.close()


def test_phase_source_credentials_authenticate_and_stay_secret() -> None:
    """Before: urllib read ``verl:PASS@127.0.0.1`` as the host ('nonnumeric port'), and the
    error quoted the password."""
    driver = AuthServer(lambda path: driver_metrics(step=7), USER, PASSWORD)
    try:
        source = PhaseSource(with_secret(driver.port, "/metrics"))
        rec = source.fetch()
        assert rec is not None and rec.step == 7 and driver.seen == [basic()]
        assert leaks(source.url) == []
        wrong = PhaseSource(f"http://{USER}:nope@127.0.0.1:{driver.port}/metrics")
        with pytest.raises(PhaseSourceError, match="HTTP 401") as err:
            wrong.fetch()
        assert "nope" not in str(err.value)
    finally:
        driver.close()
    with pytest.raises(PhaseSourceError) as err:
        PhaseSource(with_secret(driver.port, "/metrics")).fetch()  # down: the message
    assert leaks(str(err.value)) == [] and f"127.0.0.1:{driver.port}" in str(err.value)


def test_dashboard_prometheus_credentials_authenticate_and_stay_secret() -> None:
    """``dashboard --prometheus http://user:PASS@host``: the queries authenticate; the label the
    pages show and the errors they print carry no password."""
    from dashboards.sources.base import SourceError
    from dashboards.sources.prometheus import PrometheusSource

    answer = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
    prom = AuthServer(lambda path: answer, USER, PASSWORD)
    try:
        src = PrometheusSource(with_secret(prom.port), timeout=5.0)
        assert src._get("/api/v1/query", {"query": "up"}) == json.loads(answer)["data"]
        assert prom.seen[-1] == basic()
        assert leaks(src.label) == [] and f"127.0.0.1:{prom.port}" in src.label
        src.close()
    finally:
        prom.close()
    src = PrometheusSource(with_secret(prom.port), timeout=2.0)
    with pytest.raises(SourceError) as err:
        src._get("/api/v1/query", {"query": "up"})
    src.close()
    assert leaks(str(err.value)) == []


@pytest.mark.slow
def test_the_exporter_keeps_every_password_out_of_every_output(tmp_path: Path, engine) -> None:
    """The real exporter with both URL options carrying a password: /metrics, its log, the
    store file and every file `export` writes are free of it."""
    driver = AuthServer(lambda path: driver_metrics(step=3), USER, PASSWORD)
    port = free_port()
    store = tmp_path / "run.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "exporter", "--listen-address", f"127.0.0.1:{port}",
         "--gpu-backend", "sim", "--sim-gpus", "1", "--store", str(store),
         "--rollout-server", with_secret(engine.port), "--rollout-interval", "0.2",
         "--phase-source", with_secret(driver.port, "/metrics"), "--verbose"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = ""
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    metrics = r.read().decode()
            except OSError:
                metrics = ""
            if "verlmon_rollout_requests" in metrics and len(driver.seen) >= 2:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        log_text, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        driver.close()
    assert f'server="127.0.0.1:{engine.port}"' in metrics, log_text[-2000:]
    assert set(engine.seen) == {basic()} and set(driver.seen) == {basic()}
    assert leaks(metrics) == [] and leaks(log_text) == []
    assert leaks(store.read_bytes().decode("latin-1")) == []
    out = tmp_path / "export"
    subprocess.run([sys.executable, "-m", "monitor", "export", "--out", str(out), str(store)],
                   check=True, capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    assert (out / "rollout.csv").read_text().count(f"127.0.0.1:{engine.port}") >= 1
    for f in out.iterdir():
        assert leaks(f.read_text(errors="replace")) == [], f.name


@pytest.mark.slow  # starts the CLI
@pytest.mark.parametrize("option, value", [
    ("--phase-source", f"ftp://{USER}:{QUOTED}@driver:9048/metrics"),
    ("--phase-source", f"http://{USER}:{QUOTED}@driver:port/metrics"),
    ("--rollout-server", f"http://{USER}:{QUOTED}@engine:port"),
])
def test_a_bad_url_option_is_refused_without_echoing_its_password(option, value):
    """Before: the exporter started with it (and its messages quoted the password)."""
    try:
        res = subprocess.run([sys.executable, "-m", "monitor", "exporter", "--listen-address",
                              "127.0.0.1:0", "--gpu-backend", "sim", option, value],
                             capture_output=True, text=True, timeout=60,
                             cwd=Path(__file__).resolve().parent.parent)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the exporter started with the bad URL") from exc
    code, err = res.returncode, res.stderr
    assert code == 2 and option in err and err.count("\n") == 1, err
    assert leaks(err) == []


def test_a_runbook_base_with_a_password_is_refused(tmp_path: Path, capsys) -> None:
    """``prometheus-config --runbook-base`` becomes links in every alert: a password there
    would reach everyone the alert reaches, so it is refused (and not echoed)."""
    from cli.main import main

    code = main(["prometheus-config", "--targets-dir", str(tmp_path / "t"), "--job", "j",
                 "--targets", "h:9048", "--config", str(tmp_path / "c.yml"), "--runbook-base",
                 f"https://{USER}:{QUOTED}@git.example.org/verl-monitor/blob/main/"])
    err = capsys.readouterr().err
    assert code == 2 and "--runbook-base" in err and "USER:PASS@" in err, err
    assert leaks(err) == [] and not (tmp_path / "c.yml").exists()
