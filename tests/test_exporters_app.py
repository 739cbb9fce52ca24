"""The whole exporter in this process: sim GPUs, a simulated log, NCCL dumps, the store,
live detection, clean stop; and every startup problem as one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import bcrypt
import httpx
import pytest

from cli.commands.exporter import parse_options
from exporters.node_exporter import Exporter, ExporterError
from monitor.records import Event
from monitor.store import RunStore

FIXTURE = Path(__file__).parent / "fixtures" / "nccl_inspector" / "gpu-node-01-pid4242.log"


def scrape(exporter: Exporter, **kw) -> str:
    r = httpx.get(exporter.url, timeout=10, **kw)
    r.raise_for_status()
    return r.text


def value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def wait_for(check, timeout: float = 60.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError("condition not reached in time")


@pytest.fixture
def running(tmp_path):
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    shutil.copy(FIXTURE, nccl / FIXTURE.name)
    opts = parse_options([
        "--listen-address", "127.0.0.1:0", "--interval", "0.2", "--gpu-backend", "sim",
        "--scenario", "healthy", "--sim-gpus", "2", "--sim-log", str(tmp_path / "train.log"),
        "--sim-speed", "60", "--store", str(tmp_path / "run.db"), "--nccl-dir", str(nccl),
        "--node", "testnode",
    ])
    exporter = Exporter(opts)
    exporter.start()
    yield exporter, tmp_path
    exporter.stop()


@pytest.mark.slow
def test_everything_flows_to_metrics_and_store(running):
    exporter, tmp_path = running
    assert exporter.startup_line().startswith(f"verl-monitor exporter: serving {exporter.url}")
    listed = exporter.startup_line().split("collectors: ", 1)[1].split(";")[0].split(", ")
    assert {"gpu", "host", "verl_log", "nccl", "flags"} <= set(listed)
    first = wait_for(lambda: value(scrape(exporter), "verlmon_training_step"))
    later = wait_for(lambda: (v := value(scrape(exporter), "verlmon_training_step")) and
                     v > first and v)
    assert later > first
    text = scrape(exporter)
    assert 'verlmon_node_info{backend="sim",node="testnode"} 1.0' in text
    assert 'verlmon_gpu_utilization_ratio{gpu="1"}' in text
    assert 'verlmon_nccl_operations_total{coll="AllReduce",comm="DP Group 0",rank="0"} 2.0' in text
    assert "verlmon_store_up 1.0" in text
    check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    landing = httpx.get(exporter.url.replace("/metrics", "/"), timeout=10).text
    assert "verl_log" in landing and 'href="metrics"' in landing
    exporter.stop()
    store = RunStore(tmp_path / "run.db", create=False)
    counts = store.counts()
    store.close()
    assert counts["gpu_samples"] > 0 and counts["host_samples"] > 0
    assert counts["steps"] >= later and counts["nccl_samples"] > 0


def test_detector_loop_raises_flags_into_metrics_and_store(tmp_path):
    # no log (an OOM closes once a later step completes) and no loop run between our steps
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--store", str(tmp_path / "run.db"), "--detect-interval", "600"]))
    exporter.start()
    try:
        exporter.monitor.window.add_events([Event("oom", time.time(), 3, "CUDA out of memory")])
        opened, _ = exporter.detect_once()
        assert "oom" in [f.kind for f in opened]
        text = scrape(exporter)
    finally:
        exporter.stop()
    assert 'verlmon_flags_raised_total{kind="oom",severity="critical"} 1.0' in text
    assert any(ln.startswith("verlmon_flag_active{") and 'kind="oom"' in ln
               and 'severity="critical"' in ln and ln.endswith(" 1.0")
               for ln in text.splitlines())
    store = RunStore(tmp_path / "run.db", create=False)
    kinds = [f.kind for f in store.flags()]
    store.close()
    assert "oom" in kinds


@pytest.mark.slow
def test_new_steps_trigger_the_detectors(tmp_path):
    # the tick is parked at 600 s: any run here comes from steps arriving in the log
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--scenario", "healthy", "--sim-log", str(tmp_path / "train.log"), "--sim-speed", "60",
        "--interval", "0.2", "--detect-interval", "600"]))
    exporter.start()
    try:
        wait_for(lambda: exporter.monitor.detect_runs >= 2)
        assert exporter.monitor.window.steps_added >= 2
        assert exporter.monitor.detect_errors == 0
    finally:
        exporter.stop()


@pytest.mark.slow
def test_a_run_played_faster_is_measured_on_its_own_clock(tmp_path):
    """At --sim-speed 30 a 30 s step takes 1 s of wall time; the steps, the GPU samples and
    the detectors' clock are all in the run's own seconds, so each step's phases are laid
    over the samples taken in them (before, a step's 30 logged seconds were laid over the
    last 30 wall seconds: ten steps at 10x, and a healthy run read 68% SM)."""
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--scenario", "healthy", "--sim-log", str(tmp_path / "train.log"), "--sim-speed", "30",
        "--interval", "0.1", "--detect-interval", "600", "--no-collector.nccl"]))
    exporter.start()
    try:
        wait_for(lambda: exporter.monitor.window.steps_added >= 4)
        steps, gpu, _, _ = exporter.monitor.window.frames()
        now_sim = exporter.live_sim.now_sim()
        assert abs(exporter.monitor.now() - now_sim) < 5.0  # not the wall clock
        assert time.time() + 60.0 < now_sim
    finally:
        exporter.stop()
    ends = [s.end_time for s in steps]
    for prev, cur, s in zip(ends, ends[1:], steps[1:], strict=False):
        assert cur - prev == pytest.approx(s.total, abs=1.0)  # the log's own seconds
    assert gpu["ts"].max() >= ends[-1]  # samples on the same clock, up to the last step


def test_no_secret_reaches_a_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("VERLMON_TEST_TOKEN", "env-token-4711")
    password = "pw-never-exported-93"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    argv = ["--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
            "--web.config.file", str(web), "--no-collector.host"]
    exporter = Exporter(parse_options(argv))
    exporter.start()
    try:
        assert httpx.get(exporter.url, timeout=10).status_code == 401
        text = scrape(exporter, auth=("prom", password))
    finally:
        exporter.stop()
    assert "verlmon_build_info" in text
    for secret in ("env-token-4711", password, hashed, str(web), " ".join(argv)):
        assert secret not in text
    assert all(v not in text for k, v in os.environ.items() if len(v) > 12 and k != "PATH")


class _Capture(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        _Capture.bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        return


def test_flags_reach_slack_and_the_url_stays_secret(tmp_path):
    hook_server = HTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=hook_server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook_server.server_address[1]}/services/T000/B000/secretpath"
    hook = tmp_path / "hook"
    hook.write_text(url + "\n")
    _Capture.bodies = []
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--store", str(tmp_path / "run.db"), "--slack-webhook-file", str(hook),
        "--detect-interval", "600"]))
    exporter.start()
    try:
        exporter.monitor.window.add_events([Event("oom", time.time(), 7, "CUDA out of memory")])
        exporter.detect_once()
        assert exporter.monitor.notifier.deliver() == 1
        text = scrape(exporter)
    finally:
        exporter.stop()
        hook_server.shutdown()
        hook_server.server_close()
    assert len(_Capture.bodies) == 1
    assert "oom" in json.dumps(_Capture.bodies[0]).lower()
    assert "secretpath" not in text and str(hook) not in text


def _busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--interval", "0.05"], "--interval must be at least 0.1 seconds (got 0.05)"),
        (["--listen-address", "nowhere"], "is not HOST:PORT"),
        (["--web.config.file", "{tmp}/absent.yml"], "absent.yml: no such file"),
        (["--sim-log", "{tmp}/x.log"], "--sim-log needs --gpu-backend sim and --scenario"),
        (["--gpu-backend", "sim", "--scenario", "nope", "--sim-log", "{tmp}/x.log"],
         "unknown scenario 'nope'"),
        (["--store", "{tmp}/no/such/dir/run.db"], "--store"),
        (["--store", "{tmp}/garbage.db"], "not a verl-monitor run store"),
        (["--config", "{tmp}/absent.yaml"], "absent.yaml"),
        (["--slack-webhook-file", "{tmp}/hook"], "hook: no such file"),
        (["--listen-address", "127.0.0.1:{busy}"], "cannot listen on 127.0.0.1:"),
    ],
)
def test_startup_problems_are_one_line(tmp_path, argv, message):
    (tmp_path / "garbage.db").write_bytes(b"this is not sqlite" * 100)
    busy = _busy_port()
    try:
        argv = [a.format(tmp=tmp_path, busy=busy.getsockname()[1]) for a in argv]
        opts = parse_options(["--listen-address", "127.0.0.1:0", "--gpu-backend", "sim",
                              "--sim-gpus", "1", *argv])
        with pytest.raises(ExporterError) as info:
            exporter = Exporter(opts)
            exporter.start()
        assert message in str(info.value)
        assert "\n" not in str(info.value)
    finally:
        busy.close()


@pytest.mark.slow
def test_a_throughput_drop_stays_flagged_after_the_runs_start_leaves_the_window(tmp_path):
    from detect_builders import make_steps

    # a 1-second window: the run's first steps age out before the degraded ones arrive
    exporter = Exporter(parse_options([
        "--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--sim-gpus", "1",
        "--window", "1", "--detect-interval", "600", "--no-collector.host"]))
    steps = make_steps(70, throughput=lambda i: 1000.0 if i <= 32 else 600.0)
    exporter.start()
    try:
        exporter.monitor.window.add_steps(steps[:32])
        time.sleep(1.5)
        exporter.monitor.window.add_steps(steps[32:])
        assert [s.step for s in exporter.monitor.window.frames()[0]][0] == 33
        exporter.detect_once()
        # the detector loop may have run on the new steps first: read the open flags
        active = list(exporter.monitor.tracker.active())
    finally:
        exporter.stop()
    (flag,) = [f for f in active if f.kind == "throughput_regression"]
    assert "40% below" in flag.evidence and flag.severity == "critical"


def test_the_startup_line_says_where_it_listens():
    """Issue 38 item 6: ``run`` printed http://HOST:9048/metrics while listening on every
    interface; the words now say which, beside the URL a person can open."""
    from exporters.node_exporter import listening_words

    assert listening_words(("0.0.0.0", 9048)) == "listening on 0.0.0.0:9048, every interface"
    assert listening_words(("::", 9048)) == "listening on [::]:9048, every interface"
    assert listening_words(("127.0.0.1", 9048)) == "listening on 127.0.0.1:9048 only"
